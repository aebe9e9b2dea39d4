"""GPU facts (pure data): the GPU types the API knows, how Kubernetes names their resource, and
the node labels NVIDIA's GPU feature discovery (GFD) writes for them.

The operator selects nodes by these labels, the local cluster labels its fake nodes with them,
and admission checks a pool's nodeSelector against them, so they live here, in the bottom layer
that every other package may import.
"""

from __future__ import annotations

from dataclasses import dataclass

GPU_RESOURCE = "nvidia.com/gpu"
"""The extended resource a pod requests GPUs by (NVIDIA's device plugin advertises it)."""

# Node labels as GFD writes them.
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
"""GPU memory in MiB."""
GPU_FAMILY_LABEL = "nvidia.com/gpu.family"
GPU_COMPUTE_MAJOR_LABEL = "nvidia.com/gpu.compute.major"
GPU_COMPUTE_MINOR_LABEL = "nvidia.com/gpu.compute.minor"


@dataclass(frozen=True)
class Gpu:
    """One GPU type as GFD would label a node that has it."""

    name: str
    """The name the API uses (`spec.runtime.gpu.type`)."""
    product: str
    """`nvidia.com/gpu.product` as GFD writes it."""
    memory_mib: int
    family: str
    compute_major: int
    compute_minor: int


# Product strings and memory as GFD reports them on the common SKUs.
GPU_TYPES: dict[str, Gpu] = {
    gpu.name: gpu
    for gpu in (
        Gpu("H100", "NVIDIA-H100-80GB-HBM3", 81559, "hopper", 9, 0),
        Gpu("H200", "NVIDIA-H200", 143771, "hopper", 9, 0),
        Gpu("B200", "NVIDIA-B200", 183359, "blackwell", 10, 0),
        Gpu("A100", "NVIDIA-A100-SXM4-80GB", 81920, "ampere", 8, 0),
        Gpu("L4", "NVIDIA-L4", 23034, "ada-lovelace", 8, 9),
    )
}
"""Every GPU type the API accepts, by name; `spec.GpuType` lists the same names."""


def gpu_type_of(product: str) -> str:
    """The GPU type name for an `nvidia.com/gpu.product` value; the value itself if unknown."""
    return next((gpu.name for gpu in GPU_TYPES.values() if gpu.product == product), product)
