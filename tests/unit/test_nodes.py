"""Fake GPU node manifests: labels, capacity and taint per GPU type; node pools (the default
covers every sample's GPU type, `--pools` parsing, the single-type form); bad arguments are
refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from llmfleet.core.cluster.errors import ClusterError
from llmfleet.core.cluster.local import ClusterSpec
from llmfleet.core.cluster.nodes import (
    DEFAULT_POOLS,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    GPU_TYPES,
    NodePool,
    choose_pools,
    format_pools,
    gpu_node,
    gpu_nodes,
    gpu_type_of,
    parse_pools,
    pool_nodes,
)
from tests.crds.cases import SAMPLES


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
        # Only ours: the TTL controller's annotation set here conflicts past 100 nodes.
        assert node["metadata"]["annotations"] == {"kwok.x-k8s.io/node": "fake"}
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


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda path: path.stem)
def test_the_default_pools_have_nodes_for_every_sample(sample: Path) -> None:
    spec = yaml.safe_load(sample.read_text())["spec"]
    wanted = GPU_TYPES[spec.get("runtime", {}).get("gpu", {}).get("type", "H100")].product
    products = {node["metadata"]["labels"][GPU_PRODUCT_LABEL] for node in pool_nodes(DEFAULT_POOLS)}
    assert wanted in products


def test_pool_nodes_are_named_per_type_and_keep_their_counts() -> None:
    manifests = pool_nodes((NodePool("H100", 2, 8), NodePool("L4", 1, 2)))
    names = [node["metadata"]["name"] for node in manifests]
    assert names == ["gpu-h100-0", "gpu-h100-1", "gpu-l4-0"]
    assert [node["status"]["capacity"][GPU_RESOURCE] for node in manifests] == ["8", "8", "2"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("H100=2,H200=1", (("H100", 2), ("H200", 1)), id="default-form"),
        pytest.param(" h200=3 , l4=1 ", (("H200", 3), ("L4", 1)), id="spaces-and-case"),
        pytest.param("B200=1", (("B200", 1),), id="one-pool"),
    ],
)
def test_pools_parse(text: str, expected: tuple[tuple[str, int], ...]) -> None:
    pools = parse_pools(text, gpus_per_node=4)
    assert tuple((pool.gpu_type, pool.nodes) for pool in pools) == expected
    assert {pool.gpus_per_node for pool in pools} == {4}
    assert parse_pools(format_pools(pools), 4) == pools


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("H100", "--pools expects TYPE=NODES", id="no-count"),
        pytest.param("H100=two", "--pools expects TYPE=NODES", id="not-a-number"),
        pytest.param("", "--pools expects TYPE=NODES", id="empty"),
        pytest.param("H100=0", "--pools: 'H100=0' needs at least 1 node", id="zero-nodes"),
        pytest.param("X100=1", "unknown GPU type 'X100': choose one of", id="unknown-gpu"),
        pytest.param("H100=1,h100=2", "--pools names H100 twice", id="twice"),
    ],
)
def test_bad_pools_are_one_line_errors(text: str, message: str) -> None:
    with pytest.raises(ClusterError, match=message) as caught:
        parse_pools(text)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("pools", "count", "gpu", "expected"),
    [
        pytest.param(None, None, None, format_pools(DEFAULT_POOLS), id="default-pools"),
        pytest.param(None, 3, None, "H100=3", id="nodes-only-is-h100"),
        pytest.param(None, None, "h200", "H200=2", id="gpu-type-only-is-2-nodes"),
        pytest.param(None, 1, "A100", "A100=1", id="single-type"),
        pytest.param((NodePool("L4", 4),), None, None, "L4=4", id="given-pools"),
    ],
)
def test_choose_pools(
    pools: tuple[NodePool, ...] | None, count: int | None, gpu: str | None, expected: str
) -> None:
    chosen = choose_pools(pools, count, gpu, gpus_per_node=8)
    assert format_pools(chosen) == expected


def test_default_pools_take_the_gpus_per_node() -> None:
    assert {pool.gpus_per_node for pool in choose_pools(None, None, None, 2)} == {2}


def test_pools_and_a_single_type_are_alternatives() -> None:
    with pytest.raises(ClusterError, match="--pools and --nodes/--gpu-type are alternatives"):
        choose_pools(DEFAULT_POOLS, 2, None, 8)


@pytest.mark.parametrize(
    ("product", "name"),
    [
        pytest.param("NVIDIA-H100-80GB-HBM3", "H100", id="known"),
        pytest.param("NVIDIA-GH200-480GB", "NVIDIA-GH200-480GB", id="unknown-kept"),
    ],
)
def test_gpu_type_of_product(product: str, name: str) -> None:
    assert gpu_type_of(product) == name


@pytest.mark.parametrize(
    ("written", "pools"),
    [
        pytest.param(
            {"name": "c", "pools": [{"gpu_type": "H100", "nodes": 2, "gpus_per_node": 8},
                                    {"gpu_type": "H200", "nodes": 1, "gpus_per_node": 8}],
             "port": 6443},
            "H100=2,H200=1", id="pools",
        ),
        pytest.param(
            {"name": "c", "nodes": 3, "gpus_per_node": 4, "gpu_type": "A100", "port": 6443},
            "A100=3", id="single-type-before-pools",
        ),
    ],
)  # fmt: skip
def test_cluster_json_reads_back(written: dict[str, object], pools: str) -> None:
    spec = ClusterSpec.from_json(json.dumps(written))
    assert (spec.name, spec.port, format_pools(spec.pools)) == ("c", 6443, pools)
    assert ClusterSpec.from_json(spec.to_json()) == spec


@pytest.mark.parametrize(
    ("gpu_type", "product", "mig", "labels", "capacity"),
    [
        pytest.param("H100", 1, None,
                     {"nvidia.com/gpu.product": "NVIDIA-H100-PCIe",
                      "nvidia.com/gpu.memory": "81559", "nvidia.com/mig.capable": "true"},
                     {"nvidia.com/gpu": "2"}, id="h100-pcie"),
        pytest.param("H100", 2, None, {"nvidia.com/gpu.product": "NVIDIA-H100-NVL",
                                       "nvidia.com/gpu.memory": "95830"},
                     {"nvidia.com/gpu": "2"}, id="h100-nvl"),
        pytest.param("L4", 0, None, {"nvidia.com/mig.capable": "false"}, {"nvidia.com/gpu": "2"},
                     id="l4-no-mig"),
        pytest.param("A100", 2, {"1g.5gb": 7, "3g.20gb": 2},
                     {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
                      "nvidia.com/mig.strategy": "mixed", "nvidia.com/mig-1g.5gb.count": "7",
                      "nvidia.com/mig-3g.20gb.count": "2"},
                     {"nvidia.com/gpu": "0", "nvidia.com/mig-1g.5gb": "7",
                      "nvidia.com/mig-3g.20gb": "2"}, id="a100-mig-mixed"),
    ],
)  # fmt: skip
def test_a_node_of_another_product_or_with_mig_slices_is_labelled_as_gfd_does(
    gpu_type: str,
    product: int,
    mig: dict[str, int] | None,
    labels: dict[str, str],
    capacity: dict[str, str],
) -> None:
    gpu = GPU_TYPES[gpu_type]
    node = gpu_node("n", gpu, 2, product=gpu.products[product], mig=mig)
    assert {key: node["metadata"]["labels"][key] for key in labels} == labels
    assert {key: node["status"]["allocatable"][key] for key in capacity} == capacity


def test_a_product_or_mig_profile_of_another_type_is_refused() -> None:
    with pytest.raises(ClusterError, match="NVIDIA-H200 is not a product of H100"):
        gpu_node("n", GPU_TYPES["H100"], 1, product=GPU_TYPES["H200"].products[0])
    with pytest.raises(ClusterError, match=r"L4 has no MIG profile 1g\.10gb"):
        gpu_node("n", GPU_TYPES["L4"], 1, mig={"1g.10gb": 1})
