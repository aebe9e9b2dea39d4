"""What the autoscaler keeps of the engine pods its watch brings (issue 28): the pod informers'
`transform` (`llmfleet.core.informer`), applied to every pod before the cache holds it.

A pass reads little of a pod: the service it belongs to (`kube.service_of`) and how the policy
counts it (`kube.pod_view`), and the informer itself reads the pod's key and resourceVersion.
A pod is kept as:
- `metadata`: `name`, `namespace`, `resourceVersion`, `deletionTimestamp`, and of `labels` only
  `llmfleet.dev/service`, `llmfleet.dev/pool` and `llmfleet.dev/serving`;
- `status.conditions`: only the `Ready` condition's `type` and `status` and the `PodScheduled`
  condition's `type`, `status` and `reason`;
- nothing else: no `spec`, no `managedFields` (the API server's record of which manager set
  which field, half of an engine pod's JSON), no other label, annotation or owner reference, none
  of the rest of `status` (container statuses, IPs, times, messages).
A field a pass starts to read must be added here (`tests/autoscaler/test_kept.py` compares the
pods a pass counts from kept and from whole pods, and fails on a field dropped and read).

Strings repeated from one pod to the next are interned, one copy for all: the namespace, the
label keys and values (a service's name and its pools' are on each of its pods), the conditions'
types, statuses and reasons. A watch event is parsed on its own, so without this every pod would
hold its own copy of each.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from llmfleet.crds import labels as L

METADATA = ("name", "namespace", "resourceVersion", "deletionTimestamp")
"""The metadata kept of a pod, besides its labels."""
LABELS = (L.SERVICE, L.POOL, L.SERVING)
"""The labels kept of a pod."""
CONDITIONS = {"Ready": ("type", "status"), "PodScheduled": ("type", "status", "reason")}
"""The conditions kept of a pod, by type, and what is kept of each."""


def _interned(value: Any) -> Any:
    return sys.intern(value) if type(value) is str else value


def pod(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What the autoscaler keeps of a pod (this module's docstring); `obj` is not changed."""
    meta = obj.get("metadata") or {}
    metadata: dict[str, Any] = {key: meta[key] for key in METADATA if key in meta}
    if "namespace" in metadata:
        metadata["namespace"] = _interned(metadata["namespace"])
    labels = meta.get("labels")
    if isinstance(labels, Mapping):
        metadata["labels"] = {
            sys.intern(key): _interned(labels[key]) for key in LABELS if key in labels
        }
    kept: dict[str, Any] = {"metadata": metadata}
    status = obj.get("status")
    if isinstance(status, Mapping) and isinstance(status.get("conditions"), list):
        kept["status"] = {
            "conditions": [
                {key: _interned(c[key]) for key in CONDITIONS[c["type"]] if key in c}
                for c in status["conditions"]
                if isinstance(c, Mapping) and c.get("type") in CONDITIONS
            ]
        }
    return kept
