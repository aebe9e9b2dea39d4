"""`llmfleet up --engine vllm-cpu`: one sample served by real vLLM (its CPU build) on the real node.

The engine pod runs the local engine image, whose `vllm` runs the real vLLM when
`LLMFLEET_VLLM_VENV` names a venv (core/vllm_shim.py). The venv and the tiny model are the build
in the cache (`llmfleet images vllm-cpu`, core/images/vllm_cpu.py), handed to the pod as a
PersistentVolumeClaim bound to a `local` PersistentVolume of that directory on the real node:
the sample's `pvc://vllm-cpu/model` source mounts it read-only, the pod spec stays within Pod
Security `restricted` (a claim is an allowed volume, a hostPath is not), and the 6 GB venv is
not copied into an image layer (3.3 GB gzip'd, ~11 min here, and again into containerd).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

from llmfleet.core.cluster.errors import ClusterError
from llmfleet.core.cluster.realnode_config import REAL_NODE_LABEL
from llmfleet.core.images import vllm_cpu

ENGINES = ("simulator", "vllm-cpu")
"""What `llmfleet up --engine` takes: the samples' simulator only, or also real vLLM."""
CLAIM = "vllm-cpu"
"""The claim the sample's model source names (`pvc://vllm-cpu/model`)."""
SAMPLE = Path(__file__).resolve().parent / "samples" / "vllm-cpu.yaml"
SERVED_NAME = "tiny"
"""The sample's `servedName`: what clients ask for."""
CAPACITY = "16Gi"
"""The volume's nominal size (a `local` volume is what the directory holds; the claim asks for
no more than this)."""


def volume_name(namespace: str) -> str:
    """One PersistentVolume per namespace's claim (a volume binds one claim)."""
    return f"llmfleet-{CLAIM}-{namespace}"


def manifests(build: Path, node: str, namespace: str = "default") -> list[dict[str, Any]]:
    """The PersistentVolume of the build's directory (`venv/`, `model/`) on `node`, and the claim
    bound to it in `namespace`, read-only for every pod."""
    volume = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": volume_name(namespace),
            "labels": {"app.kubernetes.io/part-of": "llmfleet"},
        },
        "spec": {
            "capacity": {"storage": CAPACITY},
            "accessModes": ["ReadOnlyMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "volumeMode": "Filesystem",
            "claimRef": {"namespace": namespace, "name": CLAIM},
            "local": {"path": str(build)},
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "kubernetes.io/hostname",
                                    "operator": "In",
                                    "values": [node],
                                }
                            ]
                        }
                    ]
                }
            },
        },
    }
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": CLAIM, "namespace": namespace},
        "spec": {
            "accessModes": ["ReadOnlyMany"],
            "storageClassName": "",
            "volumeName": volume_name(namespace),
            "resources": {"requests": {"storage": CAPACITY}},
        },
    }
    return [volume, claim]


class Kubectl(Protocol):
    """`kubectl ARGS…` against the cluster, its stdout (LocalCluster.kubectl, the e2e suite's)."""

    def __call__(self, *args: str, stdin: str | None = None) -> str: ...


def real_node_name(kubectl: Kubectl) -> str:
    """The real node's name (the node labelled `REAL_NODE_LABEL`)."""
    names = kubectl(
        "get", "nodes", "-l", REAL_NODE_LABEL, "-o", "jsonpath={.items[*].metadata.name}"
    ).split()
    if len(names) != 1:
        raise ClusterError(
            f"expected one real node (label {REAL_NODE_LABEL}), found {names or 'none'}"
        )
    return names[0]


def install(
    kubectl: Kubectl, build: Path, services: Path = SAMPLE, namespace: str = "default"
) -> None:
    """Bind the claim to `build` (a directory of `llmfleet images vllm-cpu`) on the real node,
    then apply `services` (the sample by default)."""
    vllm_cpu.share(build / "model")
    node = real_node_name(kubectl)
    listed = {"apiVersion": "v1", "kind": "List", "items": manifests(build, node, namespace)}
    kubectl("apply", "-f", "-", stdin=json.dumps(listed))
    kubectl("apply", "-f", str(services))
