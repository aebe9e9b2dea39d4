"""The operator against the real local cluster (issue 3's acceptance criteria)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmfleet.core.cluster.nodes import GPU_TYPES, gpu_node
from llmfleet.crds import labels as L
from tests.cluster.crashing_operator import KILLED
from tests.cluster.kube import (
    Kube,
    condition,
    install_crds,
    serving_endpoints,
    wait_endpoints,
    wait_ready,
)
from tests.cluster.operator_process import OperatorProcess
from tests.crds.cases import SAMPLES, SAMPLES_DIR

pytestmark = pytest.mark.cluster

CHILD_KINDS = "deployments,services,configmaps,poddisruptionbudgets"


SUFFIX = os.getpid() % 10000
NAMESPACES = {
    name: f"op-{name}-{SUFFIX}"
    for name in ("samples", "gpu", "nomatch", "spares", "drain", "drift", "delete")
}
"""The module operator's namespaces, named up front: kopf serves exact names reliably, while
with glob patterns it may stop watching a namespace as soon as its deletion starts."""
DRAIN_SECONDS = 8


@pytest.fixture(scope="module")
def operator(kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    """One operator for the module, watching the namespaces in NAMESPACES."""
    install_crds(kube)
    args = [arg for ns in NAMESPACES.values() for arg in ("-n", ns)]
    # An 8 s drain (not the usual 3 s): the scale-down test reads the draining state after
    # seeing the demotion, and a loaded machine must not let the drain end in between.
    process = OperatorProcess(
        kube, tmp_path_factory.mktemp("operator") / "operator.log", "--standalone", *args,
        env={"LLMFLEET_OPERATOR_DRAIN_SECONDS": str(DRAIN_SECONDS)},
    )  # fmt: skip
    yield process
    process.stop()
    for node in ADDED_NODES:  # leave the session's cluster as the module found it
        kube.kubectl("delete", "node", node, "--wait=false")


def make_ns(kube: Kube, key: str) -> Iterator[str]:
    name = NAMESPACES[key]
    kube.kubectl("create", "namespace", name)
    yield name
    kube.kubectl("delete", "namespace", name, "--timeout=120s")


def _namespace(key: str) -> Any:
    """A fixture giving a test its own namespace among those the module operator watches."""

    @pytest.fixture
    def fixture(kube: Kube, operator: OperatorProcess) -> Iterator[str]:
        yield from make_ns(kube, key)

    return fixture


ns_samples = _namespace("samples")
ns_gpu = _namespace("gpu")
ns_nomatch = _namespace("nomatch")
ns_spares = _namespace("spares")
ns_drain = _namespace("drain")
ns_drift = _namespace("drift")
ns_delete = _namespace("delete")


ADDED_NODES: list[str] = []


def add_node(kube: Kube, name: str, gpu_type: str, gpus: int = 8) -> None:
    ADDED_NODES.append(name)
    node = gpu_node(name, GPU_TYPES[gpu_type], gpus)
    document = json.dumps(node)
    kube.kubectl("apply", "--server-side", "--field-manager=llmfleet-tests", "-f", "-",
                 stdin=document)  # fmt: skip
    kube.kubectl("apply", "--server-side", "--field-manager=llmfleet-tests",
                 "--subresource=status", "-f", "-", stdin=document)  # fmt: skip


def test_every_sample_becomes_ready_with_its_children(kube: Kube, ns_samples: str) -> None:
    ns = ns_samples  # the session's cluster has the default node pools: no node is added
    for sample in SAMPLES:
        kube.kubectl("apply", "--server-side", "-n", ns, "-f", str(sample))
    for sample in SAMPLES:
        manifest = yaml.safe_load(sample.read_text())
        name = manifest["metadata"]["name"]
        wait_ready(kube, ns, name)
        pools = ["prefill", "decode"] if "prefill" in manifest["spec"]["topology"] else ["unified"]
        children = kube.get(CHILD_KINDS, "-n", ns, "-l", f"{L.SERVICE}={name}")["items"]
        names = sorted(f"{c['kind']}/{c['metadata']['name']}" for c in children)
        expected = [f"ConfigMap/{name}-runtime", f"Service/{name}-metrics"]
        for pool in pools:
            expected += [f"Deployment/{name}-{pool}", f"PodDisruptionBudget/{name}-{pool}",
                         f"Service/{name}-{pool}"]  # fmt: skip
        assert names == sorted(expected)
        status = kube.get(f"inferenceservices.llmfleet.dev/{name}", "-n", ns)["status"]
        for pool in pools:
            assert status["pools"][pool]["servingReplicas"] >= 1
            service = f"{name}-{pool}"
            kube.wait_for(lambda service=service: serving_endpoints(kube, ns, service), 30,
                          f"a ready endpoint of {service}")  # fmt: skip
    listing = kube.kubectl("get", "llmsvc", "-n", ns)
    print(listing)
    assert listing.split()[:7] == ["NAME", "MODE", "READY", "SERVING", "CANARY", "ENDPOINT", "AGE"]
    assert listing.count("True") == len(SAMPLES)


def test_insufficient_gpu_then_a_new_node_makes_it_ready(kube: Kube, ns_gpu: str) -> None:
    ns = ns_gpu
    add_node(kube, "gpu-a100-0", "A100")
    service = {
        "apiVersion": "llmfleet.dev/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": "needs-16-a100"},
        "spec": {"model": {"name": "org/big"}, "runtime": {"gpu": {"type": "A100", "count": 8}},
                 "topology": {"unified": {"replicas": 2}}},
    }  # fmt: skip
    kube.kubectl("apply", "--server-side", "-n", ns, "-f", "-", stdin=json.dumps(service))
    kube.wait_for(lambda: condition(kube, ns, "needs-16-a100").get("reason") == "InsufficientGPU",
                  60, "reason InsufficientGPU")  # fmt: skip
    ready = condition(kube, ns, "needs-16-a100")
    print(f"Ready={ready['status']} {ready['reason']}: {ready['message']}")
    assert ready["status"] == "False"
    assert "nvidia.com/gpu" in ready["message"]
    warnings = kube.get("events", "-n", ns, "--field-selector", "type=Warning")["items"]
    assert any(event["reason"] == "InsufficientGPU" for event in warnings)

    add_node(kube, "gpu-a100-1", "A100")
    wait_ready(kube, ns, "needs-16-a100")


def test_a_gpu_type_no_node_has_is_named_then_a_node_of_it_makes_it_ready(
    kube: Kube, ns_nomatch: str
) -> None:
    ns, name = ns_nomatch, "needs-b200"
    service = {
        "apiVersion": "llmfleet.dev/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {"model": {"name": "org/new"}, "runtime": {"gpu": {"type": "B200", "count": 1}},
                 "topology": {"unified": {"replicas": 1}}},
    }  # fmt: skip
    kube.kubectl("apply", "--server-side", "-n", ns, "-f", "-", stdin=json.dumps(service))
    kube.wait_for(lambda: condition(kube, ns, name).get("reason") == "NoMatchingGPUNodes",
                  60, "reason NoMatchingGPUNodes")  # fmt: skip
    ready = condition(kube, ns, name)
    print(f"Ready={ready['status']} {ready['reason']}: {ready['message']}")
    assert ready["status"] == "False"
    for words in ("No node has B200 GPUs", "NVIDIA-H100-80GB-HBM3", "spec.runtime.gpu.type",
                  "add nodes with B200 GPUs"):  # fmt: skip
        assert words in ready["message"]
    warnings = kube.get("events", "-n", ns, "--field-selector", "type=Warning")["items"]
    assert any(event["reason"] == "NoMatchingGPUNodes" for event in warnings)

    add_node(kube, "gpu-b200-test", "B200")
    wait_ready(kube, ns, name)


def test_spare_promotion_adds_an_endpoint_without_creating_a_pod(
    kube: Kube, ns_spares: str
) -> None:
    ns = ns_spares
    kube.kubectl("apply", "--server-side", "-n", ns, "-f", str(SAMPLES_DIR / "spares.yaml"))
    name, pool_service = "qwen-7b-spares", "qwen-7b-spares-unified"
    wait_ready(kube, ns, name)
    kube.wait_for(lambda: kube.get("pods", "-n", ns, "-l", f"{L.SERVING}=false")["items"], 30,
                  "a warm spare")  # fmt: skip
    before = {p["metadata"]["name"] for p in kube.get("pods", "-n", ns)["items"]}
    wait_endpoints(kube, ns, pool_service, 1)

    started = time.monotonic()
    kube.kubectl("patch", f"inferenceservices.llmfleet.dev/{name}", "-n", ns, "--type=merge",
                 "-p", '{"spec":{"topology":{"unified":{"replicas":2}}}}')  # fmt: skip

    def two_endpoints() -> list[str] | None:
        endpoints = serving_endpoints(kube, ns, pool_service)
        return endpoints if len(endpoints) == 2 else None

    endpoints = kube.wait_for(two_endpoints, 30, "a second serving endpoint", interval=0.05)
    seconds = time.monotonic() - started
    print(f"spare promoted into the EndpointSlice in {seconds:.2f}s")
    assert set(endpoints) <= before, "the new endpoint is an existing (spare) pod"
    # The spare is backfilled in the background.
    kube.wait_for(lambda: len(kube.get("pods", "-n", ns)["items"]) == 3, 30, "a backfilled spare")


def test_scale_down_demotes_first_and_deletes_after_the_drain(kube: Kube, ns_drain: str) -> None:
    ns = ns_drain
    kube.kubectl("apply", "--server-side", "-n", ns, "-f", str(SAMPLES_DIR / "unified.yaml"))
    wait_ready(kube, ns, "llama-8b")
    wait_endpoints(kube, ns, "llama-8b-unified", 2)
    kube.kubectl("patch", "inferenceservices.llmfleet.dev/llama-8b", "-n", ns, "--type=merge",
                 "-p", '{"spec":{"topology":{"unified":{"replicas":1}}}}')  # fmt: skip

    def demoted() -> list[dict[str, Any]]:
        pods = kube.get("pods", "-n", ns, "-l", f"{L.SERVICE}=llama-8b")["items"]
        return [p for p in pods if L.DEMOTED_AT in p["metadata"].get("annotations", {})]

    draining = kube.wait_for(demoted, 30, "a demoted pod")
    # Still running while it drains: read at once, since the drain (DRAIN_SECONDS, from a
    # timestamp cut to the second) ends on its own clock, while the EndpointSlice may lag.
    assert kube.get("deployment/llama-8b-unified", "-n", ns)["spec"]["replicas"] == 2
    assert draining[0]["metadata"]["labels"][L.SERVING] == "false"
    assert draining[0]["metadata"]["annotations"][L.DELETION_COST] == "500"
    # Out of the Service at once (as soon as the EndpointSlice controller follows the label).
    wait_endpoints(kube, ns, "llama-8b-unified", 1)
    # After the drain period (DRAIN_SECONDS) the surplus pod goes.
    kube.wait_for(lambda: kube.get("deployment/llama-8b-unified", "-n", ns)["spec"]["replicas"]
                  == 1, 30, "the Deployment to shrink after the drain")  # fmt: skip
    kube.wait_for(lambda: len(kube.get("pods", "-n", ns, "-l", f"{L.SERVICE}=llama-8b")["items"])
                  == 1, 60, "one pod left")  # fmt: skip
    assert len(serving_endpoints(kube, ns, "llama-8b-unified")) == 1


def test_hand_edits_to_a_child_deployment_are_put_back(kube: Kube, ns_drift: str) -> None:
    ns = ns_drift
    kube.kubectl("apply", "--server-side", "-n", ns, "-f", str(SAMPLES_DIR / "unified.yaml"))
    wait_ready(kube, ns, "llama-8b")
    deployment = "deployment/llama-8b-unified"
    kube.kubectl("patch", deployment, "-n", ns, "--type=merge", "-p", json.dumps({
        "metadata": {"labels": {L.MANAGED_BY: "someone"}},
        "spec": {"replicas": 5, "template": {"spec": {"containers": [
            {"name": "engine", "image": "evil/image:latest"}]}}},
    }))  # fmt: skip

    def restored() -> bool:
        current = kube.get(deployment, "-n", ns)
        return (
            current["spec"]["replicas"] == 2
            and current["metadata"]["labels"][L.MANAGED_BY] == L.MANAGED_BY_VALUE
            and current["spec"]["template"]["spec"]["containers"][0]["image"] != "evil/image:latest"
        )

    kube.wait_for(restored, 30, "the operator to revert the hand edits")


def test_deleting_the_service_removes_everything_it_owns(kube: Kube, ns_delete: str) -> None:
    """No finalizer holds the deletion (kopf would put one on every service with a daemon:
    `handlers._without_finalizer`); a service made again under the same name is served again."""
    ns = ns_delete
    kube.kubectl("apply", "--server-side", "-n", ns, "-f", str(SAMPLES_DIR / "unified.yaml"))
    wait_ready(kube, ns, "llama-8b")
    service = kube.get("inferenceservices.llmfleet.dev/llama-8b", "-n", ns)
    assert not service["metadata"].get("finalizers"), service["metadata"]
    kube.kubectl("delete", "inferenceservices.llmfleet.dev/llama-8b", "-n", ns, "--timeout=60s")
    kube.kubectl("apply", "--server-side", "-n", ns, "-f", str(SAMPLES_DIR / "unified.yaml"))
    again = kube.get("inferenceservices.llmfleet.dev/llama-8b", "-n", ns)
    assert again["metadata"]["uid"] != service["metadata"]["uid"]
    wait_ready(kube, ns, "llama-8b")
    kube.kubectl("delete", "inferenceservices.llmfleet.dev/llama-8b", "-n", ns, "--timeout=60s")
    kube.wait_for(
        lambda: not kube.get(f"{CHILD_KINDS},pods", "-n", ns, "-l", f"{L.SERVICE}=llama-8b")[
            "items"
        ],
        60, "garbage collection of every child",
    )  # fmt: skip


def test_operator_killed_before_writing_status_converges_without_duplicates(
    kube: Kube, tmp_path: Path
) -> None:
    ns = "crash-test"
    install_crds(kube)  # this test runs no `operator` fixture, which installs them otherwise
    kube.kubectl("create", "namespace", ns)
    try:
        kube.kubectl("apply", "--server-side", "-n", ns, "-f", str(SAMPLES_DIR / "unified.yaml"))
        crashing = OperatorProcess(
            kube, tmp_path / "crash.log", "--standalone", "-n", ns,
            main="tests.cluster.crashing_operator",
        )  # fmt: skip
        assert crashing.wait(60) == KILLED, crashing.text()
        crashing.stop()
        assert kube.get("deployments", "-n", ns)["items"], "children were created before the kill"
        assert "status" not in kube.get("inferenceservices.llmfleet.dev/llama-8b", "-n", ns)

        again = OperatorProcess(kube, tmp_path / "again.log", "--standalone", "-n", ns)
        try:
            wait_ready(kube, ns, "llama-8b")
        finally:
            again.stop()
        service = kube.get("inferenceservices.llmfleet.dev/llama-8b", "-n", ns)
        assert service["status"]["observedGeneration"] == service["metadata"]["generation"]
        assert len(kube.get("deployments", "-n", ns)["items"]) == 1
        assert len(kube.get("configmaps", "-n", ns, "-l", L.SERVICE)["items"]) == 1
        pods = kube.get("pods", "-n", ns, "-l", f"{L.SERVICE}=llama-8b")["items"]
        assert len(pods) == 2
    finally:
        kube.kubectl("delete", "namespace", ns, "--timeout=120s")


def test_two_replicas_never_both_act(kube: Kube, operator: OperatorProcess, tmp_path: Path) -> None:
    ns = f"peering-{SUFFIX}"
    kube.kubectl("create", "namespace", ns)
    replicas = [OperatorProcess(kube, tmp_path / f"replica-{i}.log", "-n", ns) for i in range(2)]
    try:

        def peers() -> int:
            found = kube.run("get", "kopfpeerings.kopf.dev/llmfleet", "-n", ns, "-o", "json")
            if found.returncode != 0:  # not created yet by the replicas
                return 0
            return len(json.loads(found.stdout).get("status") or {})

        kube.wait_for(lambda: peers() == 2, 60, "both replicas in the peering object")
        kube.kubectl("apply", "--server-side", "-n", ns, "-f", str(SAMPLES_DIR / "unified.yaml"))
        wait_ready(kube, ns, "llama-8b")
        acting = [r for r in replicas if "Promoted" in r.text()]
        assert len(acting) == 1, [r.text()[-2000:] for r in replicas]
        standby = next(r for r in replicas if r is not acting[0])

        # The active replica leaves; the standby takes over and acts on the next change.
        acting[0].stop()
        kube.kubectl(
            "patch",
            "inferenceservices.llmfleet.dev/llama-8b",
            "-n",
            ns,
            "--type=merge",
            "-p",
            '{"spec":{"topology":{"unified":{"replicas":3}}}}',
        )
        kube.wait_for(lambda: "Promoted" in standby.text(), 90, "the standby to take over")
        kube.wait_for(
            lambda: (
                condition(kube, ns, "llama-8b")
                .get("message", "")
                .startswith("All pools serve: unified 3/3")
            ),
            60,
            "3 serving replicas",
        )
    finally:
        for replica in replicas:
            replica.stop()
        kube.kubectl("delete", "namespace", ns, "--timeout=120s")
