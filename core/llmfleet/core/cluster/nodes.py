"""Fake GPU nodes for the local cluster (pure: manifests only, no I/O).

kwok manages every Node carrying the annotation `kwok.x-k8s.io/node: fake`: it keeps the node Ready
and heartbeating and makes pods bound to it Ready. The real kube-scheduler enforces the
`nvidia.com/gpu` capacity we advertise, so pods beyond it stay Pending as on a real cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmfleet.core.cluster.errors import ClusterError

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
NODE_ROLE_LABEL = "llmfleet.dev/local-cluster"


@dataclass(frozen=True)
class GpuType:
    """What NVIDIA's GPU feature discovery would label a node with for this GPU."""

    name: str
    product: str
    """`nvidia.com/gpu.product` as GPU feature discovery writes it."""
    memory_mib: int
    family: str
    compute_major: int
    compute_minor: int


# Product strings and memory as GPU feature discovery reports them on the common SKUs.
GPU_TYPES: dict[str, GpuType] = {
    gpu.name: gpu
    for gpu in (
        GpuType("H100", "NVIDIA-H100-80GB-HBM3", 81559, "hopper", 9, 0),
        GpuType("H200", "NVIDIA-H200", 143771, "hopper", 9, 0),
        GpuType("B200", "NVIDIA-B200", 183359, "blackwell", 10, 0),
        GpuType("A100", "NVIDIA-A100-SXM4-80GB", 81920, "ampere", 8, 0),
        GpuType("L4", "NVIDIA-L4", 23034, "ada-lovelace", 8, 9),
    )
}


def gpu_type(name: str) -> GpuType:
    """Look a GPU type up by name (case-insensitive), or say which names exist."""
    for known, gpu in GPU_TYPES.items():
        if known.lower() == name.lower():
            return gpu
    raise ClusterError(f"unknown GPU type {name!r}: choose one of {', '.join(GPU_TYPES)}")


def node_name(gpu: GpuType, index: int) -> str:
    return f"gpu-{gpu.name.lower()}-{index}"


def gpu_node(name: str, gpu: GpuType, gpus: int) -> dict[str, Any]:
    """One fake node with `gpus` GPUs of type `gpu`: capacity, GPU labels and the GPU taint.

    The taint `nvidia.com/gpu=present:NoSchedule` is what managed GPU node pools set; the API
    server's ExtendedResourceToleration admission plugin (enabled by the local cluster) adds the
    matching toleration to every pod that requests `nvidia.com/gpu`, so only GPU pods land here.
    """
    if gpus < 1:
        raise ClusterError(f"--gpus-per-node must be at least 1, got {gpus}")
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        NODE_ROLE_LABEL: "gpu",
        "nvidia.com/gpu.present": "true",
        GPU_PRODUCT_LABEL: gpu.product,
        "nvidia.com/gpu.count": str(gpus),
        "nvidia.com/gpu.memory": str(gpu.memory_mib),
        "nvidia.com/gpu.family": gpu.family,
        "nvidia.com/gpu.compute.major": str(gpu.compute_major),
        "nvidia.com/gpu.compute.minor": str(gpu.compute_minor),
    }
    capacity = {
        "cpu": str(max(16, gpus * 16)),
        "memory": f"{max(128, gpus * 128)}Gi",
        "pods": "110",
        "ephemeral-storage": "1Ti",
        GPU_RESOURCE: str(gpus),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": labels,
        },
        "spec": {"taints": [{"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}]},
        "status": {
            "allocatable": dict(capacity),
            "capacity": capacity,
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "fake",
                "kubeProxyVersion": "fake",
            },
        },
    }


def gpu_nodes(count: int, gpus_per_node: int, gpu_type_name: str) -> list[dict[str, Any]]:
    """`count` identical GPU nodes, validated: a bad argument is a ClusterError, not a traceback."""
    gpu = gpu_type(gpu_type_name)
    if count < 1:
        raise ClusterError(f"--nodes must be at least 1, got {count}")
    return [gpu_node(node_name(gpu, index), gpu, gpus_per_node) for index in range(count)]
