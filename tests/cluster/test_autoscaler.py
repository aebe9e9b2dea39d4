"""The autoscaler's decisions acted on by the operator, on the real local cluster.

The autoscaler runs in this process against the real API server; its signals come from a
scripted source, because what is checked here is actuation: status.autoscaling written, a spare
promoted, GPUs running out. The Prometheus path (real Prometheus scraping engine simulators) is
tests/cluster/test_autoscaler_prometheus.py.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from llmfleet.autoscaler.inputs import PoolSignals
from llmfleet.autoscaler.kube import Kube as AutoscalerKube
from llmfleet.autoscaler.loop import Autoscaler
from llmfleet.autoscaler.metrics import AutoscalerMetrics
from llmfleet.core.cluster.nodes import GPU_TYPES, gpu_node
from llmfleet.crds import render
from tests.autoscaler.builders import PROFILE
from tests.cluster.kube import Kube, condition, serving_endpoints, wait_ready
from tests.cluster.operator_process import OperatorProcess
from tests.crds.cases import SAMPLES_DIR

pytestmark = pytest.mark.cluster

SUFFIX = os.getpid() % 10000
NAMESPACES = {name: f"as-{name}-{SUFFIX}" for name in ("promote", "limited", "floor")}
MODEL = "Qwen/Qwen2.5-7B-Instruct"  # spares.yaml's model


class ScriptedLoad:
    """Fresh signals of `rate` requests/s of 100 prompt + 200 output tokens for every pool.

    With the test profile (128 streams per replica, 8,000 prompt tok/s usable) and no SLO in the
    samples, Little's law at the default 50 ms ITL holds 10 x rate streams: rate 1 needs one
    replica, rate 20 two, rate 50 four, rate 100 eight."""

    def __init__(self, rate: float) -> None:
        self.rate = rate

    def read_services(
        self, wanted: Mapping[tuple[str, str], Sequence[str]]
    ) -> dict[tuple[str, str], dict[str, PoolSignals]]:
        return {
            key: {
                pool: PoolSignals(
                    observed_at=datetime.now(UTC),
                    request_rate=self.rate,
                    prompt_tokens_rate=self.rate * 100,
                    mean_prompt_tokens=100,
                    mean_output_tokens=200,
                )
                for pool in pools
            }
            for key, pools in wanted.items()
        }


@pytest.fixture(scope="module")
def operator(kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    for manifest in sorted(render.MANIFESTS_DIR.glob("*.yaml")):
        kube.kubectl(
            "apply", "--server-side", "--field-manager=llmfleet-tests", "-f", str(manifest)
        )
    kube.kubectl("wait", "--for=condition=Established", "--timeout=30s", f"crd/{render.CRD_NAME}")
    args = [arg for ns in NAMESPACES.values() for arg in ("-n", ns)]
    process = OperatorProcess(
        kube, tmp_path_factory.mktemp("operator") / "operator.log", "--standalone", *args
    )
    yield process
    process.stop()


def namespace(kube: Kube, key: str) -> Iterator[str]:
    name = NAMESPACES[key]
    kube.kubectl("create", "namespace", name)
    yield name
    kube.kubectl("delete", "namespace", name, "--timeout=120s")


@pytest.fixture
def ns_promote(kube: Kube, operator: OperatorProcess) -> Iterator[str]:
    yield from namespace(kube, "promote")


@pytest.fixture
def ns_limited(kube: Kube, operator: OperatorProcess) -> Iterator[str]:
    yield from namespace(kube, "limited")


@pytest.fixture
def ns_floor(kube: Kube, operator: OperatorProcess) -> Iterator[str]:
    yield from namespace(kube, "floor")


MakeAutoscaler = Callable[[str, ScriptedLoad], Autoscaler]


@pytest.fixture
def autoscaler(kube: Kube) -> Iterator[MakeAutoscaler]:
    """Autoscalers in this process over a namespace, their watches stopped after the test (a
    watch left running retries, and logs, from its thread while the interpreter finalizes)."""
    clients: list[AutoscalerKube] = []

    def make(ns: str, load: ScriptedLoad) -> Autoscaler:
        clients.append(AutoscalerKube(kube.api(), [ns], "llmfleet-autoscaler"))
        return Autoscaler(
            clients[-1],
            load,
            AutoscalerMetrics(),
            profiles={MODEL: PROFILE.model_copy(update={"model": MODEL})},
        )

    yield make
    for client in clients:
        client.stop()


def decided(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    status = kube.get(f"inferenceservices.llmfleet.dev/{name}", "-n", ns).get("status", {})
    autoscaling: dict[str, Any] = status.get("autoscaling") or {}
    return autoscaling


def pods(kube: Kube, ns: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kube.get("pods", "-n", ns)["items"]
    return items


def ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def test_a_decision_promotes_a_spare_within_seconds_and_backfills_it(
    kube: Kube, ns_promote: str, autoscaler: MakeAutoscaler
) -> None:
    ns, name = ns_promote, "qwen-7b-spares"
    kube.kubectl("apply", "--server-side", "-n", ns, "-f", str(SAMPLES_DIR / "spares.yaml"))
    wait_ready(kube, ns, name)
    kube.wait_for(lambda: sum(map(ready, pods(kube, ns))) == 2, 60, "a serving pod and a spare")

    load = ScriptedLoad(rate=1.0)
    scaler = autoscaler(ns, load)
    (first,) = scaler.run_once(datetime.now(UTC))
    assert first.written
    assert decided(kube, ns, name)["pools"]["unified"]["active"] == 1
    before = {p["metadata"]["name"] for p in pods(kube, ns)}

    load.rate = 20.0
    started = time.monotonic()
    (second,) = scaler.run_once(datetime.now(UTC))
    wanted = second.decision.pools["unified"]
    assert wanted.active >= 2, wanted.reason
    assert wanted.reason.startswith(f"scale up 1 -> {wanted.active}")

    def promoted() -> list[str]:
        found = serving_endpoints(kube, ns, f"{name}-unified")
        return found if len(found) >= 2 else []

    endpoints = kube.wait_for(promoted, 30, "the spare in the pool's EndpointSlice", interval=0.05)
    print(f"decision -> promoted spare serving in {time.monotonic() - started:.2f}s")
    assert set(endpoints) <= before, "every endpoint is a pod that ran before the decision"

    # The spare is backfilled: active + 1 pods, all of them Ready in the end.
    total = wanted.active + wanted.spares
    kube.wait_for(lambda: sum(map(ready, pods(kube, ns))) == total, 90, f"{total} Ready pods")
    status = decided(kube, ns, name)
    assert status["pools"]["unified"]["active"] == wanted.active
    assert status["pools"]["unified"]["reason"] == wanted.reason
    assert status["limited"] is False
    events = kube.get("events", "-n", ns, "--field-selector", "reason=Scaled")["items"]
    assert any(e["source"]["component"] == "llmfleet-autoscaler" for e in events)


@pytest.fixture
def a100_node(kube: Kube) -> Iterator[str]:
    """A node with two A100s: the only GPUs of that type in the cluster."""
    name = f"a100-autoscaler-{SUFFIX}"
    document = json.dumps(gpu_node(name, GPU_TYPES["A100"], 2))
    kube.kubectl("apply", "--server-side", "--field-manager=llmfleet-tests", "-f", "-",
                 stdin=document)  # fmt: skip
    kube.kubectl("apply", "--server-side", "--field-manager=llmfleet-tests",
                 "--subresource=status", "-f", "-", stdin=document)  # fmt: skip
    yield name
    kube.kubectl("delete", "node", name, "--wait=false")


SCARCE = """
apiVersion: llmfleet.dev/v1alpha1
kind: InferenceService
metadata:
  name: scarce
spec:
  model: {name: "Qwen/Qwen2.5-7B-Instruct"}
  runtime:
    gpu: {type: A100, count: 1}
  topology:
    unified: {replicas: 1, minReplicas: 1, maxReplicas: 50}
  autoscaling: {enabled: true}
"""


def test_exhausted_gpus_give_scaling_limited_not_more_pending_pods(
    kube: Kube, ns_limited: str, a100_node: str, tmp_path: Path, autoscaler: MakeAutoscaler
) -> None:
    ns, name = ns_limited, "scarce"
    kube.kubectl("apply", "--server-side", "-n", ns, "-f", "-", stdin=SCARCE)
    wait_ready(kube, ns, name)

    load = ScriptedLoad(rate=50.0)  # four replicas' worth; two A100s exist
    scaler = autoscaler(ns, load)
    (first,) = scaler.run_once(datetime.now(UTC))
    wanted = first.decision.pools["unified"].active
    assert wanted > 2, first.decision.pools["unified"].reason

    def pending() -> list[str]:
        return [
            p["metadata"]["name"]
            for p in pods(kube, ns)
            if any(
                c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
                for c in p.get("status", {}).get("conditions") or []
            )
        ]

    kube.wait_for(lambda: len(pending()) == wanted - 2, 60, f"{wanted - 2} unschedulable pods")
    # The autoscaler sees pods through its own watch, which may lag kubectl's read.
    kube.wait_for(
        lambda: sum(p.unschedulable for p in scaler.kube.list_pods().get((ns, name), []))
        == wanted - 2,
        30, "the autoscaler's watch to see the unschedulable pods",
    )  # fmt: skip

    load.rate = 100.0  # twice the load: without the limit this would ask for more pods
    for _ in range(3):
        (outcome,) = scaler.run_once(datetime.now(UTC))
        time.sleep(0.5)
    plan = outcome.decision.pools["unified"]
    assert plan.active == wanted
    assert "Pending unschedulable" in plan.limited

    status = decided(kube, ns, name)
    assert status["limited"] is True
    assert "Pending unschedulable" in status["message"]

    def scaling_limited() -> dict[str, Any]:
        found = condition(kube, ns, name, "ScalingLimited")
        return found if found.get("status") == "True" else {}

    limited = kube.wait_for(scaling_limited, 30, "ScalingLimited=True")
    assert limited["reason"] == "AutoscalerLimited"
    assert "Pending unschedulable" in limited["message"]
    time.sleep(2)  # the operator has had time to act on anything new
    assert len(pods(kube, ns)) == wanted
    assert len(pending()) == wanted - 2


UNSET_FLOOR = """
apiVersion: llmfleet.dev/v1alpha1
kind: InferenceService
metadata:
  name: light
spec:
  model: {name: "Qwen/Qwen2.5-7B-Instruct"}
  runtime:
    gpu: {type: H100, count: 1}
  topology:
    unified: {replicas: 1, maxReplicas: 4}
  autoscaling: {enabled: true}
"""


def test_an_unset_min_replicas_is_the_policys_floor_and_its_memory_survives_a_restart(
    kube: Kube, ns_floor: str, autoscaler: MakeAutoscaler
) -> None:
    """minReplicas unset: a load one replica serves still gets two (the policy's floor until it
    measures the pool light), and what it measured is in status.autoscaling as the API server
    stores it (the CRD's schema keeps `floorMemory`), for a restarted autoscaler to read back."""
    ns, name = ns_floor, "light"
    kube.kubectl("apply", "--server-side", "-n", ns, "-f", "-", stdin=UNSET_FLOOR)
    wait_ready(kube, ns, name)
    load = ScriptedLoad(rate=1.0)  # one replica's worth
    (first,) = autoscaler(ns, load).run_once(datetime.now(UTC))
    assert first.written
    stored = decided(kube, ns, name)["pools"]["unified"]
    assert stored["active"] == 2, stored["reason"]
    assert "raised to default floor 2 (minReplicas unset" in stored["reason"]
    memory = stored["floorMemory"]
    assert memory["observedSince"].endswith("Z")
    assert memory["longestLullSeconds"] == 0

    (again,) = autoscaler(ns, load).run_once(datetime.now(UTC))
    assert again.decision.state.pools["unified"].observed_since == datetime.fromisoformat(
        memory["observedSince"].replace("Z", "+00:00")
    )
    kube.wait_for(lambda: sum(map(ready, pods(kube, ns))) == 2, 90, "two Ready pods")
