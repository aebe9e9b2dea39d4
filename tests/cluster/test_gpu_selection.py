"""GPU selection by capability on the local cluster (issue 27, item 2): the API server admits
each `runtime.gpu` below, and the pod the operator renders for it is bound by the real
kube-scheduler to the one node that offers it: an H100 PCIe node, an H100 NVL (the only H100
with 94 GB), a MIG slice of an A100, a node known only by a cloud provider's label."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from llmfleet.core.cluster.nodes import GPU_PRODUCT_LABEL, GPU_TYPES, gpu_node
from llmfleet.crds import InferenceService
from llmfleet.operator.observed import Observed
from llmfleet.operator.plan import desired
from llmfleet.operator.settings import OperatorSettings
from tests.cluster.kube import Kube, install_crds

pytestmark = pytest.mark.cluster

SUFFIX = os.getpid() % 10000
CLOUD_LABEL = "cloud.google.com/gke-accelerator"
H100, A100 = GPU_TYPES["H100"], GPU_TYPES["A100"]


def _node(name: str, **kwargs: Any) -> dict[str, Any]:
    return gpu_node(f"{name}-{SUFFIX}", kwargs.pop("gpu", H100), 2, **kwargs)


NODES = {
    "pcie": _node("gpu-h100-pcie", product=H100.products[1]),
    "nvl": _node("gpu-h100-nvl", product=H100.products[2]),
    "mig": _node("gpu-a100-mig", gpu=A100, product=A100.products[0], mig={"1g.10gb": 7}),
    "cloud": _node("gpu-cloud"),
}
"""The nodes this module adds to the session's cluster (whose default pools have only the
usual product of each type, no MIG and no cloud label)."""
NODES["cloud"]["metadata"]["labels"][CLOUD_LABEL] = f"nvidia-h100-80gb-{SUFFIX}"


@pytest.fixture(scope="module")
def gpu_nodes(kube: Kube) -> Iterator[dict[str, str]]:
    install_crds(kube)
    for node in NODES.values():
        document = json.dumps(node)
        kube.kubectl("apply", "--server-side", "--field-manager=llmfleet-tests", "-f", "-",
                     stdin=document)  # fmt: skip
        kube.kubectl("apply", "--server-side", "--field-manager=llmfleet-tests",
                     "--subresource=status", "-f", "-", stdin=document)  # fmt: skip
    yield {key: node["metadata"]["name"] for key, node in NODES.items()}
    for node in NODES.values():
        kube.kubectl("delete", "node", node["metadata"]["name"], "--wait=false")


def _service(gpu: dict[str, Any], node_selector: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "llmfleet.dev/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": "gpu-pick"},
        "spec": {"model": {"name": "org/model"}, "runtime": {"gpu": gpu},
                 "topology": {"mode": "Unified",
                              "unified": {"replicas": 1, "nodeSelector": node_selector}}},
    }  # fmt: skip


def _engine_pod(manifest: dict[str, Any], namespace: str) -> dict[str, Any]:
    """The pod the operator's Deployment would create, as a bare Pod (no controller needed)."""
    service = InferenceService.model_validate(
        manifest | {"metadata": {"name": "gpu-pick", "namespace": namespace, "uid": "u"}}
    )
    plan = desired(service, Observed(), OperatorSettings(), datetime.now(UTC))
    deployment = next(o for o in plan.objects if o["kind"] == "Deployment")
    template = deployment["spec"]["template"]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "engine", "labels": template["metadata"]["labels"]},
            "spec": template["spec"]}  # fmt: skip


@pytest.mark.parametrize(
    ("gpu", "node_selector", "lands_on"),
    [
        pytest.param({"type": "H100"}, {GPU_PRODUCT_LABEL: "NVIDIA-H100-PCIe"}, "pcie",
                     id="h100-pcie-by-the-pool-selector"),
        pytest.param({"type": "H100", "minMemoryGB": 94}, {}, "nvl", id="h100-with-94-gb"),
        pytest.param({"type": "A100", "mig": "1g.10gb"}, {}, "mig", id="a100-mig-slice"),
        pytest.param({"type": "H100", "nodeLabel": CLOUD_LABEL,
                      "products": [f"nvidia-h100-80gb-{SUFFIX}"]}, {}, "cloud",
                     id="cloud-provider-label"),
    ],
)  # fmt: skip
def test_the_engine_pod_lands_on_the_node_that_offers_the_gpu(
    kube: Kube,
    gpu_nodes: dict[str, str],
    namespace: str,
    *,
    gpu: dict[str, Any],
    node_selector: dict[str, str],
    lands_on: str,
) -> None:
    manifest = _service(gpu, node_selector)
    # The API server's admission (the CRD's CEL) accepts the spec.
    kube.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-",
                 stdin=json.dumps(manifest))  # fmt: skip
    pod = _engine_pod(manifest, namespace)
    kube.kubectl("create", "-n", namespace, "-f", "-", stdin=json.dumps(pod))

    def node_name() -> str:
        found: str = kube.get("pod", "engine", "-n", namespace)["spec"].get("nodeName", "")
        return found

    bound = kube.wait_for(node_name, 60, f"the scheduler binding the pod for {gpu}")
    assert bound == gpu_nodes[lands_on]


def test_a_mig_profile_no_node_offers_stays_pending_for_that_resource(
    kube: Kube, gpu_nodes: dict[str, str], namespace: str
) -> None:
    manifest = _service({"type": "A100", "mig": "3g.40gb"}, {})
    kube.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-",
                 stdin=json.dumps(manifest))  # fmt: skip
    kube.kubectl("create", "-n", namespace, "-f", "-",
                 stdin=json.dumps(_engine_pod(manifest, namespace)))  # fmt: skip

    def unschedulable() -> str:
        status = kube.get("pod", "engine", "-n", namespace).get("status", {})
        said = [c.get("message", "") for c in status.get("conditions", [])
                if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"]  # fmt: skip
        return said[0] if said else ""

    message = kube.wait_for(unschedulable, 60, "the scheduler refusing the pod")
    assert "nvidia.com/mig-3g.40gb" in message


@pytest.mark.parametrize(
    ("gpu", "words"),
    [
        pytest.param({"type": "L4", "mig": "1g.10gb"}, "gpu.mig is not a MIG profile of gpu.type",
                     id="mig-on-l4"),
        pytest.param({"type": "H100", "minMemoryGB": 141},
                     "gpu.minMemoryGB is more than any product of gpu.type", id="memory"),
    ],
)  # fmt: skip
def test_admission_refuses_a_gpu_no_node_can_offer(
    kube: Kube, gpu_nodes: dict[str, str], namespace: str, gpu: dict[str, Any], words: str
) -> None:
    result = kube.run("apply", "--dry-run=server", "-n", namespace, "-f", "-",
                      stdin=json.dumps(_service(gpu, {})))  # fmt: skip
    assert result.returncode != 0
    assert words in result.stderr
