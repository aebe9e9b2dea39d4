"""GPU facts (pure data): the GPU types the API knows, how Kubernetes names their resource, and
the node labels NVIDIA's GPU feature discovery (GFD) writes for them.

The operator selects nodes by these labels (every product of a type's family that has the memory
asked for), the local cluster labels its fake nodes with them, and admission checks
`runtime.gpu` and a pool's nodeSelector against them, so they live here, in the bottom layer
that every other package may import.
"""

from __future__ import annotations

from dataclasses import dataclass

GPU_RESOURCE = "nvidia.com/gpu"
"""The extended resource a pod requests whole GPUs by (NVIDIA's device plugin advertises it)."""
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
"""With the device plugin's `mixed` MIG strategy, each MIG profile is a resource of its own:
`nvidia.com/mig-1g.10gb`. (With `single`, slices are `nvidia.com/gpu` and GFD's product label
names the slice, `NVIDIA-A100-SXM4-40GB-MIG-1g.5gb`: select them with `gpu.products`.)"""

# Node labels as GFD writes them.
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
"""GPU memory in MiB."""
GPU_FAMILY_LABEL = "nvidia.com/gpu.family"
GPU_COMPUTE_MAJOR_LABEL = "nvidia.com/gpu.compute.major"
GPU_COMPUTE_MINOR_LABEL = "nvidia.com/gpu.compute.minor"
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
"""`none`, `single` or `mixed`, as the device plugin was configured."""
MIG_CAPABLE_LABEL = "nvidia.com/mig.capable"


def mig_count_label(profile: str) -> str:
    """GFD's label of a node's slices of one profile under the `mixed` strategy."""
    return f"nvidia.com/mig-{profile}.count"


def mig_resource(profile: str) -> str:
    """The resource of one MIG profile under the `mixed` strategy."""
    return MIG_RESOURCE_PREFIX + profile


@dataclass(frozen=True)
class Product:
    """One product of a GPU type as GFD labels a node that has it."""

    label: str
    """`nvidia.com/gpu.product` as GFD writes it."""
    memory_gb: int
    """Memory per GPU as sold (80 for an H100 80GB): what `gpu.minMemoryGB` compares with."""
    memory_mib: int
    """`nvidia.com/gpu.memory` as GFD writes it (what the driver reports, in MiB)."""


@dataclass(frozen=True)
class Gpu:
    """One GPU type (`spec.runtime.gpu.type`): the products of its family, its MIG profiles."""

    name: str
    """The name the API uses (`spec.runtime.gpu.type`)."""
    products: tuple[Product, ...]
    """Every product of the type a pod may run on; the first is its usual (SXM) one."""
    family: str
    compute_major: int
    compute_minor: int
    mig_profiles: tuple[str, ...] = ()
    """MIG profiles its products offer (`<compute>g.<memory>gb`); none where it has no MIG.
    Where products differ (A100 40 GB and 80 GB) this is the union; `mig_memory_gb` reads a
    profile's memory from its name."""

    @property
    def product(self) -> str:
        """The usual product's label (what a local cluster's node of this type carries)."""
        return self.products[0].label

    @property
    def memory_mib(self) -> int:
        return self.products[0].memory_mib

    def fitting(self, min_memory_gb: int | None) -> tuple[Product, ...]:
        """The products with at least `min_memory_gb` per GPU (all of them when None)."""
        least = min_memory_gb or 0
        return tuple(product for product in self.products if product.memory_gb >= least)


def mig_memory_gb(profile: str) -> int:
    """A MIG profile's memory from its name: `3g.40gb` -> 40."""
    return int(profile.split(".", 1)[1].removesuffix("gb"))


_BLACKWELL_180 = ("1g.23gb", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb")
_HOPPER_80 = ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")
# Product strings and memory as GFD reports them on the common SKUs; MIG profiles as NVIDIA's
# MIG user guide lists them.
GPU_TYPES: dict[str, Gpu] = {
    gpu.name: gpu
    for gpu in (
        Gpu("H100", (Product("NVIDIA-H100-80GB-HBM3", 80, 81559),
                     Product("NVIDIA-H100-PCIe", 80, 81559),
                     Product("NVIDIA-H100-NVL", 94, 95830)),
            "hopper", 9, 0, _HOPPER_80),
        Gpu("H200", (Product("NVIDIA-H200", 141, 143771),
                     Product("NVIDIA-H200-NVL", 141, 143771)),
            "hopper", 9, 0, ("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb")),
        Gpu("B200", (Product("NVIDIA-B200", 180, 183359),),
            "blackwell", 10, 0, _BLACKWELL_180),
        Gpu("A100", (Product("NVIDIA-A100-SXM4-80GB", 80, 81920),
                     Product("NVIDIA-A100-80GB-PCIe", 80, 81920),
                     Product("NVIDIA-A100-SXM4-40GB", 40, 40960),
                     Product("NVIDIA-A100-PCIE-40GB", 40, 40960)),
            "ampere", 8, 0, ("1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb", *_HOPPER_80)),
        Gpu("L4", (Product("NVIDIA-L4", 24, 23034),), "ada-lovelace", 8, 9),
    )
}  # fmt: skip
"""Every GPU type the API accepts, by name; `spec.GpuType` lists the same names."""


def gpu_type_of(product: str) -> str:
    """The GPU type name for an `nvidia.com/gpu.product` value; the value itself if unknown."""
    return next(
        (gpu.name for gpu in GPU_TYPES.values() if any(p.label == product for p in gpu.products)),
        product,
    )
