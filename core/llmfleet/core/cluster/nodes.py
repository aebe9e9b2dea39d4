"""Fake GPU nodes for the local cluster (pure: manifests only, no I/O).

The cluster is a set of node pools, one GPU type each (`H100=2,H200=1`). The default pools hold
every GPU type the sample services in `e2e/samples/` ask for, so each sample runs on a default
cluster (a unit test keeps it so).

kwok manages every Node carrying the annotation `kwok.x-k8s.io/node: fake`: it keeps the node Ready
and heartbeating and makes pods bound to it Ready. The real kube-scheduler enforces the
`nvidia.com/gpu` capacity we advertise, so pods beyond it stay Pending as on a real cluster.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from llmfleet.core.cluster.errors import ClusterError
from llmfleet.crds.gpus import (
    GPU_COMPUTE_MAJOR_LABEL,
    GPU_COMPUTE_MINOR_LABEL,
    GPU_COUNT_LABEL,
    GPU_FAMILY_LABEL,
    GPU_MEMORY_LABEL,
    GPU_PRESENT_LABEL,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    GPU_TYPES,
    MIG_CAPABLE_LABEL,
    MIG_STRATEGY_LABEL,
    Gpu,
    Product,
    gpu_type_of,
    mig_count_label,
    mig_resource,
)

# The GPU facts are the API's (llmfleet.crds.gpus); the local cluster's callers may read the
# ones it uses from here too.
__all__ = [
    "DEFAULT_POOLS",
    "GPU_PRODUCT_LABEL",
    "GPU_RESOURCE",
    "GPU_TYPES",
    "KWOK_ANNOTATION",
    "NODE_ROLE_LABEL",
    "POOLS_SYNTAX",
    "NodePool",
    "choose_pools",
    "format_pools",
    "gpu_node",
    "gpu_nodes",
    "gpu_type",
    "gpu_type_of",
    "node_name",
    "parse_pools",
    "pool_nodes",
]

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
NODE_ROLE_LABEL = "llmfleet.dev/local-cluster"


def gpu_type(name: str) -> Gpu:
    """Look a GPU type up by name (case-insensitive), or say which names exist."""
    for known, gpu in GPU_TYPES.items():
        if known.lower() == name.lower():
            return gpu
    raise ClusterError(f"unknown GPU type {name!r}: choose one of {', '.join(GPU_TYPES)}")


@dataclass(frozen=True)
class NodePool:
    """`nodes` fake nodes with `gpus_per_node` GPUs of `gpu_type` each."""

    gpu_type: str
    nodes: int
    gpus_per_node: int = 8

    def describe(self) -> str:
        """`2 H100 nodes x 8 GPUs`."""
        plural = "s" if self.nodes != 1 else ""
        return f"{self.nodes} {self.gpu_type} node{plural} x {self.gpus_per_node} GPUs"


DEFAULT_POOLS: tuple[NodePool, ...] = (NodePool("H100", 2), NodePool("H200", 1))
"""Two H100 nodes and one H200 node of 8 GPUs: every GPU type the samples use, and room for all
of them at their minimum sizes at once."""

POOLS_SYNTAX = "TYPE=NODES[,TYPE=NODES...] (e.g. H100=2,H200=1)"


def format_pools(pools: Sequence[NodePool]) -> str:
    """The `--pools` text for these pools: `H100=2,H200=1`."""
    return ",".join(f"{pool.gpu_type}={pool.nodes}" for pool in pools)


def parse_pools(text: str, gpus_per_node: int = 8) -> tuple[NodePool, ...]:
    """`H100=2,H200=1` -> pools of `gpus_per_node` GPUs per node; a bad entry is a ClusterError
    naming it, and a GPU type given twice is refused (say how many nodes once)."""
    pools: list[NodePool] = []
    for entry in (part.strip() for part in text.split(",")):
        name, equals, count = entry.partition("=")
        if not equals or not count.strip().isdigit():
            raise ClusterError(f"--pools expects {POOLS_SYNTAX}, got {entry!r}")
        if int(count) < 1:
            raise ClusterError(f"--pools: {entry!r} needs at least 1 node")
        gpu = gpu_type(name.strip())
        if any(pool.gpu_type == gpu.name for pool in pools):
            raise ClusterError(f"--pools names {gpu.name} twice; give its node count once")
        pools.append(NodePool(gpu.name, int(count), gpus_per_node))
    return tuple(pools)


def choose_pools(
    pools: Sequence[NodePool] | None,
    node_count: int | None,
    gpu_type_name: str | None,
    gpus_per_node: int,
) -> tuple[NodePool, ...]:
    """The pools a cluster gets: a node count or GPU type asks for one pool (2 x H100 unless
    said otherwise), else the given pools, else DEFAULT_POOLS with `gpus_per_node` GPUs.
    GPU type names come back as GPU_TYPES spells them."""
    single = node_count is not None or gpu_type_name is not None
    if pools is not None and single:
        raise ClusterError("--pools and --nodes/--gpu-type are alternatives: give one of them")
    if single:
        count = 2 if node_count is None else node_count
        chosen: Sequence[NodePool] = (NodePool(gpu_type_name or "H100", count, gpus_per_node),)
    elif pools is not None:
        chosen = pools
    else:
        chosen = [replace(pool, gpus_per_node=gpus_per_node) for pool in DEFAULT_POOLS]
    return tuple(replace(pool, gpu_type=gpu_type(pool.gpu_type).name) for pool in chosen)


def node_name(gpu: Gpu, index: int) -> str:
    return f"gpu-{gpu.name.lower()}-{index}"


def gpu_node(
    name: str,
    gpu: Gpu,
    gpus: int,
    *,
    product: Product | None = None,
    mig: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """One fake node with `gpus` GPUs of type `gpu`: capacity, GPU labels and the GPU taint,
    as NVIDIA's GFD and device plugin leave a real one.

    `product` is the node's product of the type (its usual one by default: an H100 node is
    `NVIDIA-H100-80GB-HBM3`, an `NVIDIA-H100-PCIe` one may be asked for). `mig` makes the GPUs
    MIG slices under the device plugin's `mixed` strategy: profile -> slices on the node, each
    profile a resource of its own (`nvidia.com/mig-1g.10gb`) with GFD's
    `nvidia.com/mig-<profile>.count` label, and no whole `nvidia.com/gpu` left.

    The taint `nvidia.com/gpu=present:NoSchedule` is what managed GPU node pools set; the API
    server's ExtendedResourceToleration admission plugin (enabled by the local cluster) adds the
    matching toleration to every pod that requests `nvidia.com/gpu`, so only GPU pods land here.
    """
    if gpus < 1:
        raise ClusterError(f"--gpus-per-node must be at least 1, got {gpus}")
    chosen = product or gpu.products[0]
    if chosen not in gpu.products:
        raise ClusterError(f"{chosen.label} is not a product of {gpu.name}")
    unknown = sorted(set(mig or {}) - set(gpu.mig_profiles))
    if unknown:
        raise ClusterError(f"{gpu.name} has no MIG profile {', '.join(unknown)}")
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        NODE_ROLE_LABEL: "gpu",
        GPU_PRESENT_LABEL: "true",
        GPU_PRODUCT_LABEL: chosen.label,
        GPU_COUNT_LABEL: str(gpus),
        GPU_MEMORY_LABEL: str(chosen.memory_mib),
        GPU_FAMILY_LABEL: gpu.family,
        GPU_COMPUTE_MAJOR_LABEL: str(gpu.compute_major),
        GPU_COMPUTE_MINOR_LABEL: str(gpu.compute_minor),
        MIG_CAPABLE_LABEL: "true" if gpu.mig_profiles else "false",
    }
    capacity = {
        "cpu": str(max(16, gpus * 16)),
        "memory": f"{max(128, gpus * 128)}Gi",
        "pods": "110",
        "ephemeral-storage": "1Ti",
        GPU_RESOURCE: "0" if mig else str(gpus),
    }
    if mig:
        labels[MIG_STRATEGY_LABEL] = "mixed"
        for profile, slices in mig.items():
            labels[mig_count_label(profile)] = str(slices)
            capacity[mig_resource(profile)] = str(slices)
    taint = {"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}
    return _fake_node(name, labels, capacity, [taint])


def _fake_node(
    name: str, labels: dict[str, str], capacity: dict[str, str], taints: list[dict[str, str]]
) -> dict[str, Any]:
    """A Node kwok manages (its annotation), with its capacity all allocatable.

    Nothing the control plane owns is set here: kube-controller-manager's TTL controller writes
    `node.alpha.kubernetes.io/ttl` by cluster size (15 s past 100 nodes), and a value of ours would
    make the next server-side apply of the nodes a field conflict."""
    node: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_ANNOTATION: "fake"},
            "labels": labels,
        },
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
    if taints:
        node["spec"] = {"taints": taints}
    return node


def cpu_node(name: str = "cpu-0") -> dict[str, Any]:
    """One fake node without GPUs or taints, where pods that ask for no GPU land (the chart's
    components in the cluster tests of its release)."""
    capacity = {"cpu": "16", "memory": "64Gi", "pods": "110", "ephemeral-storage": "100Gi"}
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        NODE_ROLE_LABEL: "cpu",
    }
    return _fake_node(name, labels, capacity, [])


def gpu_nodes(count: int, gpus_per_node: int, gpu_type_name: str) -> list[dict[str, Any]]:
    """`count` identical GPU nodes, validated: a bad argument is a ClusterError, not a traceback."""
    gpu = gpu_type(gpu_type_name)
    if count < 1:
        raise ClusterError(f"--nodes must be at least 1, got {count}")
    return [gpu_node(node_name(gpu, index), gpu, gpus_per_node) for index in range(count)]


def pool_nodes(pools: Sequence[NodePool]) -> list[dict[str, Any]]:
    """The nodes of every pool, validated as `gpu_nodes` does; at least one pool."""
    if not pools:
        raise ClusterError(f"no node pools given: --pools expects {POOLS_SYNTAX}")
    names = [gpu_type(pool.gpu_type).name for pool in pools]
    if len(set(names)) < len(names):
        raise ClusterError(f"a GPU type appears in two node pools: {', '.join(names)}")
    return [
        node for pool in pools for node in gpu_nodes(pool.nodes, pool.gpus_per_node, pool.gpu_type)
    ]
