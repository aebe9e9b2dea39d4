"""Which InferenceService a model name goes to when several claim it (pure, on the objects as
the API server sends them): the one created first, then by namespace and name. The gateway
routes the name to that one and leaves the others out; the operator says so on the status of
every claimant (condition `ModelNameConflict`). Every gateway replica and the operator order the
claimants alike, whatever order their caches hold them in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def served_name(obj: Mapping[str, Any]) -> str | None:
    """The model name clients send for this service (`spec.model.servedName`, else
    `spec.model.name`); None when the object names none."""
    model = ((obj.get("spec") or {}).get("model")) or {}
    name = model.get("servedName") or model.get("name")
    return str(name) if name else None


def claim_order(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    """Sort key of claimants: the first one gets the name. RFC 3339 timestamps in UTC (as the
    API server writes them) sort as text; an object without one (a test's) sorts first."""
    metadata = obj.get("metadata") or {}
    created = str(metadata.get("creationTimestamp") or "")
    return (created, str(metadata.get("namespace") or ""), str(metadata.get("name") or ""))
