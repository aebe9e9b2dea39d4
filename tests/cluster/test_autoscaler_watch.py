"""The autoscaler's engine pods come from a watch (issue 28): once its cache has synced, a pass
sends no LIST of pods (counted by the API server, `apiserver_request_total`), and the pods it
counts follow pods created, relabelled and deleted.

The autoscaler runs in this process against the real API server with a scripted signal source;
no operator runs, so the pods are made here (Pending: no node matches their selector).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from llmfleet.autoscaler.kube import Kube as AutoscalerKube
from llmfleet.autoscaler.loop import Autoscaler
from llmfleet.autoscaler.metrics import AutoscalerMetrics
from llmfleet.autoscaler.pods import PodView
from llmfleet.crds import labels as L
from tests.cluster.api_counts import api_requests, since
from tests.cluster.kube import Kube, install_crds
from tests.cluster.test_autoscaler import ScriptedLoad

pytestmark = pytest.mark.cluster

SERVICE = "watched"
READS = frozenset({("pods", ""), ("inferenceservices", "")})
FOLLOW_SECONDS = 10
"""Deadline for a change to a pod to reach the autoscaler's cache."""


def pod(name: str, service: str = SERVICE, serving: str = "true") -> str:
    return json.dumps({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {L.SERVICE: service, L.POOL: "unified",
                                              L.SERVING: serving}},
        "spec": {"nodeSelector": {"llmfleet.dev/no-such-node": "true"},
                 "containers": [{"name": "engine", "image": "engine:none"}]},
    })  # fmt: skip


@pytest.fixture
def scaler(kube: Kube, namespace: str) -> Iterator[Autoscaler]:
    install_crds(kube)
    service = {
        "apiVersion": "llmfleet.dev/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": SERVICE},
        "spec": {"model": {"name": "org/watched"}, "runtime": {"gpu": {"type": "H100"}},
                 "topology": {"mode": "Unified", "unified": {"replicas": 2}},
                 "autoscaling": {"enabled": True}},
    }  # fmt: skip
    kube.kubectl("create", "-n", namespace, "-f", "-", stdin=json.dumps(service))
    for name in ("engine-1", "engine-2"):
        kube.kubectl("create", "-n", namespace, "-f", "-", stdin=pod(name))
    kube_io = AutoscalerKube(kube.api(), [namespace], "llmfleet-autoscaler")
    try:
        yield Autoscaler(kube_io, ScriptedLoad(rate=1.0), AutoscalerMetrics())
    finally:
        kube_io.stop()


def counted(scaler: Autoscaler, namespace: str) -> list[PodView]:
    return scaler.kube.list_pods().get((namespace, SERVICE), [])


def test_a_pass_lists_no_pods_once_synced_and_the_pods_follow_changes(
    kube: Kube, namespace: str, scaler: Autoscaler
) -> None:
    scaler.run_once(datetime.now(UTC))  # the first pass waits for the first LIST
    kube.wait_for(lambda: len(counted(scaler, namespace)) == 2, FOLLOW_SECONDS, "both pods")

    before = api_requests(kube, {"LIST"}, READS)
    for _ in range(3):
        scaler.run_once(datetime.now(UTC))
    listed = since(before, api_requests(kube, {"LIST"}, READS))
    # The count sees this process: each pass still lists the services (3 passes, 3 LISTs).
    assert listed.get(("LIST", "inferenceservices", ""), 0) >= 3, listed
    assert ("LIST", "pods", "") not in listed, f"passes listed pods: {listed}"

    kube.kubectl("create", "-n", namespace, "-f", "-", stdin=pod("engine-3"))
    kube.wait_for(lambda: len(counted(scaler, namespace)) == 3, FOLLOW_SECONDS, "a new pod")

    kube.kubectl("label", "-n", namespace, "pod", "engine-1", f"{L.SERVING}=false",
                 "--overwrite")  # fmt: skip
    kube.wait_for(
        lambda: sum(not view.serving for view in counted(scaler, namespace)) == 1,
        FOLLOW_SECONDS,
        "a pod relabelled out of serving",
    )
    kube.kubectl("label", "-n", namespace, "pod", "engine-2", f"{L.SERVICE}=another",
                 "--overwrite")  # fmt: skip
    kube.wait_for(
        lambda: (
            len(counted(scaler, namespace)) == 2
            and len(scaler.kube.list_pods().get((namespace, "another"), [])) == 1
        ),
        FOLLOW_SECONDS,
        "a pod relabelled to another service",
    )
    kube.kubectl("delete", "-n", namespace, "pod", "engine-3", "--grace-period=0", "--force")
    kube.wait_for(lambda: len(counted(scaler, namespace)) == 1, FOLLOW_SECONDS, "a deleted pod")
    assert [view.serving for view in counted(scaler, namespace)] == [False]
