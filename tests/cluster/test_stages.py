"""Our kwok stages on a real cluster: with a pod runner owning engine readiness, an engine pod
runs (IP, phase Running) but is not Ready until the runner says so, while any other pod is Ready
at once; nodes turn Ready and deleted pods go away in both modes (stages.py replaces all of
kwok's defaults, so these are ours to get right)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmfleet.core.cluster import LocalCluster
from llmfleet.core.cluster.nodes import NodePool
from llmfleet.core.cluster.stages import ENGINE_NOT_STARTED, ENGINE_POOL_LABEL
from tests.cluster.kube import Kube
from tests.net import require_isolation

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def runner_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kube]:
    """A second, small cluster in the mode `llmfleet up` uses (the session's `kube` is bare)."""
    require_isolation()
    cluster = LocalCluster("llmfleet-stages", state=tmp_path_factory.mktemp("stages-state"))
    cluster.up(
        pools=[NodePool("H100", 1, 8)],
        runner_owns_engines=True,
        step=lambda message: print(f"[stages cluster] {message}", file=sys.stderr),
    )
    try:
        yield Kube(Path(cluster.kubeconfig))
    finally:
        cluster.down()


def pod(name: str, labels: dict[str, str]) -> str:
    manifest: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {
            "tolerations": [{"operator": "Exists"}],  # the fake node and GPU taints
            "containers": [{"name": "main", "image": "example/fake:1"}],
        },
    }
    return yaml.safe_dump(manifest)


def ready_condition(kube: Kube, name: str) -> dict[str, Any] | None:
    status = kube.get("pod", name, "-n", "default").get("status", {})
    if status.get("phase") != "Running" or not status.get("podIP"):
        return None
    found: dict[str, Any] = next(c for c in status["conditions"] if c["type"] == "Ready")
    return found


def test_an_engine_pod_runs_unready_until_its_runner_says_so(runner_cluster: Kube) -> None:
    kube = runner_cluster
    kube.wait_for(lambda: kube.ok("get", "serviceaccount", "default"), 30, "the default account")
    kube.kubectl("apply", "-f", "-", stdin=pod("engine", {ENGINE_POOL_LABEL: "unified"}))
    kube.kubectl("apply", "-f", "-", stdin=pod("plain", {"app": "plain"}))
    engine = kube.wait_for(lambda: ready_condition(kube, "engine"), 30, "the engine pod running")
    plain = kube.wait_for(lambda: ready_condition(kube, "plain"), 30, "the plain pod running")
    assert plain["status"] == "True"
    assert (engine["status"], engine.get("reason")) == ("False", ENGINE_NOT_STARTED)
    container = kube.get("pod", "engine", "-n", "default")["status"]["containerStatuses"][0]
    assert container["ready"] is False
    time.sleep(3)  # kwok does not come back to it: still not Ready later (only a runner flips it)
    assert ready_condition(kube, "engine") == engine
    kube.kubectl(
        "delete", "pod", "engine", "plain", "-n", "default", "--wait=true", "--timeout=30s"
    )
    assert kube.get("pods", "-n", "default")["items"] == []


def test_nodes_are_ready_in_both_modes(runner_cluster: Kube, kube: Kube) -> None:
    for cluster in (runner_cluster, kube):
        for node in cluster.get("nodes")["items"]:
            conditions = {c["type"]: c["status"] for c in node["status"]["conditions"]}
            assert conditions["Ready"] == "True", node["metadata"]["name"]
            assert node["status"]["allocatable"]["nvidia.com/gpu"] != "0"
