"""Fake GPU node manifests: labels, capacity and taint per GPU type; bad arguments are refused."""

from __future__ import annotations

import pytest

from llmfleet.core.cluster.errors import ClusterError
from llmfleet.core.cluster.nodes import GPU_RESOURCE, gpu_nodes


@pytest.mark.parametrize(
    ("gpu_type", "product", "family"),
    [
        pytest.param("H100", "NVIDIA-H100-80GB-HBM3", "hopper", id="h100"),
        pytest.param("h200", "NVIDIA-H200", "hopper", id="h200-lowercase"),
        pytest.param("B200", "NVIDIA-B200", "blackwell", id="b200"),
        pytest.param("A100", "NVIDIA-A100-SXM4-80GB", "ampere", id="a100"),
        pytest.param("L4", "NVIDIA-L4", "ada-lovelace", id="l4"),
    ],
)
def test_nodes_carry_gpu_feature_discovery_labels(gpu_type: str, product: str, family: str) -> None:
    manifests = gpu_nodes(3, 4, gpu_type)
    assert len(manifests) == 3
    assert len({node["metadata"]["name"] for node in manifests}) == 3
    for node in manifests:
        labels = node["metadata"]["labels"]
        assert labels["nvidia.com/gpu.product"] == product
        assert labels["nvidia.com/gpu.family"] == family
        assert labels["nvidia.com/gpu.count"] == "4"
        assert node["status"]["capacity"][GPU_RESOURCE] == "4"
        assert node["status"]["allocatable"][GPU_RESOURCE] == "4"
        assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
        assert {"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"} in node["spec"][
            "taints"
        ]


@pytest.mark.parametrize(
    ("count", "gpus", "gpu_type", "message"),
    [
        pytest.param(0, 8, "H100", "--nodes must be at least 1", id="zero-nodes"),
        pytest.param(-1, 8, "H100", "--nodes must be at least 1", id="negative-nodes"),
        pytest.param(2, 0, "H100", "--gpus-per-node must be at least 1", id="zero-gpus"),
        pytest.param(2, 8, "X100", "unknown GPU type 'X100': choose one of", id="unknown-gpu"),
    ],
)
def test_bad_arguments_are_one_line_errors(
    count: int, gpus: int, gpu_type: str, message: str
) -> None:
    with pytest.raises(ClusterError, match=message) as caught:
        gpu_nodes(count, gpus, gpu_type)
    assert "\n" not in str(caught.value)
