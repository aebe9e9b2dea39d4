"""What the operator keeps of the objects its watches bring (issue 28): the informers'
`transform` (`core.informer`), applied to every object before the cache, its index and the
wake-ups see it, and to the objects the operator's own writes return (`Watched.wrote`).

Pods are most of what the operator keeps (10,000 at 1,000 services of 10 pods), and a pass reads
little of one: `observed.observed_pod` and `kube.observe` (the pod's IP), `watched.py` (its key, the
service label it is indexed by, its resourceVersion). A pod is kept as:
- `metadata`: `name`, `namespace`, `uid`, `resourceVersion`, `creationTimestamp`,
  `deletionTimestamp`, and all of `labels`, `annotations` and `ownerReferences`;
- `status`: `phase`, `podIP`, and each condition's `type`, `status`, `reason` and `message`;
- `apiVersion` and `kind` where the object has them (a watch event's object does);
- nothing else: no `spec`, no `managedFields`, none of the rest of `status` (container
  statuses, `podIPs`, `hostIP`, start and transition times).
A field a pass starts to read must be added here (`tests/operator/test_kept.py` compares what a
pass observes of a pod kept and of the whole one, and fails on a field dropped and read).

Children (`kube.CHILD_KINDS` and ServiceMonitors) are compared field by field with the manifest
the operator would apply (`drift.drifted`), and a pass reads its InferenceService whole: both
are kept whole but for `metadata.managedFields` (the API server's record of which manager set
which field; nothing in the operator reads it, and it is a third to a half of a child).

Strings repeated from one object to the next are interned, one copy for all: of a pod, the
namespace, label and annotation keys and values, condition types and reasons, the owner's
reference; of a child or an InferenceService, every key and every string up to `SHORT`
characters (a Deployment's image, command, paths and flags are the same for every service). A
watch event is parsed on its own, so without this each object would hold its own copy of
every key too. (At 1,000 services of 10 pods brought by WATCH events, the caches took 806 MiB
of resident memory whole, 125 MiB trimmed and 68 MiB trimmed and interned:
`bench/results/issue28-operator-cache-memory.txt`.)
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

Transform = Callable[[Mapping[str, Any]], Mapping[str, Any]]

POD_METADATA = (
    "name", "namespace", "uid", "resourceVersion", "creationTimestamp", "deletionTimestamp",
    "labels", "annotations", "ownerReferences",
)  # fmt: skip
"""The metadata kept of a pod."""
POD_STATUS = ("phase", "podIP")
"""The status fields kept of a pod, besides its conditions."""
CONDITION = ("type", "status", "reason", "message")
"""What is kept of each of a pod's conditions."""
_SHARED_METADATA = ("namespace",)
_SHARED_CONDITION = ("type", "status", "reason")


def _same(value: Any) -> Any:
    return value


def _interned(value: Any) -> Any:
    return sys.intern(value) if type(value) is str else value


def pod(obj: Mapping[str, Any], *, intern: bool = True) -> dict[str, Any]:
    """What the operator keeps of a pod (this module's docstring)."""
    shared = _interned if intern else _same
    meta = obj.get("metadata") or {}
    metadata: dict[str, Any] = {}
    for key in POD_METADATA:
        if key not in meta:
            continue
        value = meta[key]
        if key in ("labels", "annotations") and isinstance(value, Mapping):
            value = {shared(k): shared(v) for k, v in value.items()}
        elif key == "ownerReferences" and isinstance(value, list):
            value = [{shared(k): shared(v) for k, v in ref.items()} if isinstance(ref, Mapping)
                     else ref for ref in value]  # fmt: skip
        elif key in _SHARED_METADATA:
            value = shared(value)
        metadata[key] = value
    kept: dict[str, Any] = {key: shared(obj[key]) for key in ("apiVersion", "kind") if key in obj}
    kept["metadata"] = metadata
    status = obj.get("status")
    if isinstance(status, Mapping):
        found: dict[str, Any] = {key: shared(status[key]) for key in POD_STATUS if key in status}
        conditions = status.get("conditions")
        if isinstance(conditions, list):
            found["conditions"] = [_condition(c, shared) for c in conditions]
        kept["status"] = found
    return kept


def _condition(condition: Any, shared: Callable[[Any], Any]) -> Any:
    if not isinstance(condition, Mapping):
        return condition
    return {key: shared(condition[key]) if key in _SHARED_CONDITION else condition[key]
            for key in CONDITION if key in condition}  # fmt: skip


def without_managed_fields(obj: Mapping[str, Any]) -> dict[str, Any]:
    """`obj` whole but for `metadata.managedFields` (a child, an InferenceService)."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or "managedFields" not in meta:
        return dict(obj)
    return {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}


SHORT = 64
"""Strings up to this long are interned in children: names, images, paths, flags repeat from
one service's children to the next; longer ones (a ConfigMap's data) seldom do."""


def interned_deep(value: Any) -> Any:
    """`value` rebuilt with every key and every string up to `SHORT` long interned."""
    if isinstance(value, Mapping):
        return {sys.intern(k) if type(k) is str else k: interned_deep(v) for k, v in value.items()}
    if isinstance(value, list):
        return [interned_deep(item) for item in value]
    if type(value) is str and len(value) <= SHORT:
        return sys.intern(value)
    return value


def transform(kind: str, *, intern: bool = True) -> Transform:
    """The informer's transform for objects of `kind` (a Pod, or any other kind the operator
    watches)."""
    if kind == "Pod":
        return lambda obj: pod(obj, intern=intern)
    if intern:
        return lambda obj: interned_deep(without_managed_fields(obj))
    return without_managed_fields
