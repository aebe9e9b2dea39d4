"""The GPU facts and the API agree: every GPU type the API accepts has its facts, and back."""

from __future__ import annotations

from llmfleet.crds.gpus import GPU_TYPES, gpu_type_of
from llmfleet.crds.spec import GpuType


def test_api_gpu_types_are_the_gpu_facts() -> None:
    assert [gpu.value for gpu in GpuType] == list(GPU_TYPES)


def test_products_are_distinct_and_map_back_to_their_type() -> None:
    products = [gpu.product for gpu in GPU_TYPES.values()]
    assert len(set(products)) == len(products)
    assert [gpu_type_of(product) for product in products] == list(GPU_TYPES)
    assert gpu_type_of("NVIDIA-GeForce-RTX-4090") == "NVIDIA-GeForce-RTX-4090"
