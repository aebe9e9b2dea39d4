"""The GPU facts and the API agree: every GPU type the API accepts has its facts, and back."""

from __future__ import annotations

import re

import pytest

from llmfleet.crds.gpus import GPU_TYPES, gpu_type_of, mig_memory_gb, mig_resource
from llmfleet.crds.spec import MIG_PROFILE, GpuSpec, GpuType


def test_api_gpu_types_are_the_gpu_facts() -> None:
    assert [gpu.value for gpu in GpuType] == list(GPU_TYPES)


def test_products_are_distinct_and_map_back_to_their_type() -> None:
    products = [(p.label, gpu.name) for gpu in GPU_TYPES.values() for p in gpu.products]
    assert len({label for label, _ in products}) == len(products)
    assert [gpu_type_of(label) for label, _ in products] == [name for _, name in products]
    assert gpu_type_of("NVIDIA-GeForce-RTX-4090") == "NVIDIA-GeForce-RTX-4090"


def test_mig_profiles_are_names_the_api_accepts_and_fit_a_product_of_their_type() -> None:
    for gpu in GPU_TYPES.values():
        assert len(set(gpu.mig_profiles)) == len(gpu.mig_profiles)
        for profile in gpu.mig_profiles:
            assert re.fullmatch(MIG_PROFILE, profile), profile
            assert mig_memory_gb(profile) <= max(p.memory_gb for p in gpu.products)


@pytest.mark.parametrize(
    ("gpu", "products", "resource"),
    [
        ({"type": "H100"}, ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe", "NVIDIA-H100-NVL"),
         "nvidia.com/gpu"),
        ({"type": "H100", "minMemoryGB": 81}, ("NVIDIA-H100-NVL",), "nvidia.com/gpu"),
        ({"type": "A100", "minMemoryGB": 41}, ("NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe"),
         "nvidia.com/gpu"),
        ({"type": "L4"}, ("NVIDIA-L4",), "nvidia.com/gpu"),
        ({"type": "B200", "mig": "1g.23gb"}, ("NVIDIA-B200",), mig_resource("1g.23gb")),
        ({"products": ["x"]}, ("x",), "nvidia.com/gpu"),
    ],
)  # fmt: skip
def test_a_gpu_spec_selects_the_products_with_the_memory_asked_for(
    gpu: dict[str, object], products: tuple[str, ...], resource: str
) -> None:
    spec = GpuSpec.model_validate(gpu)
    assert spec.node_products() == products
    assert spec.resource() == resource
