"""GPU selection by capability (issue 27, item 2): what `runtime.gpu` asks for becomes the engine
pods' node affinity and GPU resource, and the conditions name what no node offers."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from llmfleet.crds import InferenceService
from llmfleet.operator.observed import Observed, ObservedPod
from llmfleet.operator.plan import desired
from llmfleet.operator.settings import OperatorSettings

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
SETTINGS = OperatorSettings(drain_seconds=90)
PRODUCT = "nvidia.com/gpu.product"
H100S = ["NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe", "NVIDIA-H100-NVL"]
A100_80S = ["NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe"]
A100S = [*A100_80S, "NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB"]


def service(gpu: dict[str, Any], node_selector: dict[str, str] | None = None) -> InferenceService:
    unified: dict[str, Any] = {"replicas": 1}
    if node_selector is not None:
        unified["nodeSelector"] = node_selector
    return InferenceService.model_validate({
        "apiVersion": "llmfleet.dev/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": "gpus", "namespace": "default", "uid": "u-1", "generation": 1},
        "spec": {"model": {"name": "org/model"}, "runtime": {"gpu": gpu},
                 "topology": {"mode": "Unified", "unified": unified}},
    })  # fmt: skip


def pod_spec(svc: InferenceService) -> dict[str, Any]:
    plan = desired(svc, Observed(), SETTINGS, NOW)
    deployment = next(o for o in plan.objects if o["kind"] == "Deployment")
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


@pytest.mark.parametrize(
    ("gpu", "label", "values", "resources"),
    [
        pytest.param({}, PRODUCT, H100S, {"nvidia.com/gpu": "1"}, id="default-every-h100"),
        pytest.param({"type": "H100", "minMemoryGB": 90}, PRODUCT, ["NVIDIA-H100-NVL"],
                     {"nvidia.com/gpu": "1"}, id="memory-leaves-the-nvl"),
        pytest.param({"type": "A100", "count": 4}, PRODUCT, A100S, {"nvidia.com/gpu": "4"},
                     id="a100-40-and-80"),
        pytest.param({"type": "A100", "minMemoryGB": 80}, PRODUCT, A100_80S,
                     {"nvidia.com/gpu": "1"}, id="a100-80-only"),
        pytest.param({"type": "A100", "minMemoryGB": 40}, PRODUCT, A100S,
                     {"nvidia.com/gpu": "1"}, id="a100-40-at-the-edge"),
        pytest.param({"type": "A100", "mig": "1g.10gb"}, PRODUCT, A100S,
                     {"nvidia.com/mig-1g.10gb": "1"}, id="mig-slice-is-its-resource"),
        pytest.param({"type": "H100", "mig": "3g.40gb", "minMemoryGB": 40}, PRODUCT, H100S,
                     {"nvidia.com/mig-3g.40gb": "1"}, id="mig-memory-is-the-slice"),
        pytest.param({"type": "A100", "products": ["NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"]}, PRODUCT,
                     ["NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"], {"nvidia.com/gpu": "1"},
                     id="mig-single-strategy-by-product"),
        pytest.param({"type": "H100", "count": 8, "nodeLabel": "cloud.google.com/gke-accelerator",
                      "products": ["nvidia-h100-80gb", "nvidia-h100-mega-80gb"]},
                     "cloud.google.com/gke-accelerator",
                     ["nvidia-h100-80gb", "nvidia-h100-mega-80gb"], {"nvidia.com/gpu": "8"},
                     id="cloud-label"),
    ],
)  # fmt: skip
def test_runtime_gpu_becomes_node_affinity_and_resource(
    gpu: dict[str, Any], label: str, values: list[str], resources: dict[str, str]
) -> None:
    spec = pod_spec(service(gpu))
    required = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required == {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": label, "operator": "In", "values": values}]}]
    }  # fmt: skip
    container = spec["containers"][0]["resources"]
    gpu_keys = {key for key in container["limits"] if key.startswith("nvidia.com/")}
    assert {key: container["limits"][key] for key in gpu_keys} == resources
    assert {key: container["requests"][key] for key in gpu_keys} == resources
    # The GPU nodes' taint is tolerated whatever the resource (a MIG node is a GPU node).
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in (
        spec["tolerations"]
    )


def test_a_pools_node_selector_comes_on_top_of_the_gpu_affinity() -> None:
    spec = pod_spec(service({}, {PRODUCT: "NVIDIA-H100-PCIe", "zone": "a"}))
    assert spec["nodeSelector"] == {PRODUCT: "NVIDIA-H100-PCIe", "zone": "a"}
    term = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == H100S


UNMATCHED = "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."


@pytest.mark.parametrize(
    ("gpu", "products", "scheduler", "reason", "said"),
    [
        pytest.param({"type": "H100"}, ("NVIDIA-H100-PCIe",),
                     "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.", "InsufficientGPU",
                     ["need 1 x H100 GPU each"], id="pcie-node-counts-as-h100"),
        pytest.param({"type": "A100", "minMemoryGB": 80}, ("NVIDIA-A100-SXM4-40GB",) * 2,
                     UNMATCHED, "NoMatchingGPUNodes",
                     ["No node has A100 GPUs with 80 GB (nvidia.com/gpu.product one of "
                      "NVIDIA-A100-SXM4-80GB, NVIDIA-A100-80GB-PCIe)",
                      "A100 (nvidia.com/gpu.product=NVIDIA-A100-SXM4-40GB) on 2 node(s)",
                      "Lower spec.runtime.gpu.minMemoryGB, set spec.runtime.gpu.type to A100"],
                     id="memory-no-node-has"),
        pytest.param({"type": "A100", "mig": "1g.10gb"}, ("NVIDIA-A100-SXM4-80GB",),
                     "0/1 nodes are available: 1 Insufficient nvidia.com/mig-1g.10gb.",
                     "InsufficientGPU", ["need 1 x A100 GPU MIG slice 1g.10gb each",
                                         "Insufficient nvidia.com/mig-1g.10gb"],
                     id="no-free-mig-slice"),
        pytest.param({"type": "H100", "products": ["NVIDIA-H100-NVL"]}, ("NVIDIA-H100-PCIe",),
                     UNMATCHED, "NoMatchingGPUNodes",
                     ["No node has the listed GPUs (nvidia.com/gpu.product=NVIDIA-H100-NVL)"],
                     id="listed-products"),
        pytest.param({"type": "H100", "nodeLabel": "cloud.google.com/gke-accelerator",
                      "products": ["nvidia-h100-80gb"]}, ("NVIDIA-H100-PCIe",),
                     UNMATCHED, "Unschedulable", ["didn't match"],
                     id="cloud-label-scheduler-words"),
    ],
)  # fmt: skip
def test_conditions_name_what_no_node_offers(
    gpu: dict[str, Any], products: tuple[str, ...], scheduler: str, reason: str, said: list[str]
) -> None:
    pending = ObservedPod(
        name="p", pool="unified", created=NOW, ready=False, serving=False, unschedulable=scheduler
    )
    plan = desired(service(gpu), Observed(pods=(pending,), gpu_node_products=products),
                   SETTINGS, NOW)  # fmt: skip
    conditions = {c["type"]: c for c in plan.status["conditions"]}  # type: ignore[attr-defined]
    ready = conditions["Ready"]
    print(f"{ready['reason']}: {ready['message']}")
    assert (ready["status"], ready["reason"]) == ("False", reason)
    for words in said:
        assert words in ready["message"]
