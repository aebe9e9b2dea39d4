"""What the operator saw of one InferenceService's world (plain data, and how a pod or a status
as the API server sends it becomes that data; filled by `kube.py`)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from llmfleet.crds import labels as L
from llmfleet.crds.inference_service import (
    AutoscalingStatus,
    CanaryStatus,
    Condition,
    StableSpec,
)
from llmfleet.operator.rollout import Analysis


@dataclass(frozen=True)
class ObservedPod:
    name: str
    pool: str
    created: datetime
    ready: bool
    serving: bool
    """The pod's `llmfleet.dev/serving` label is "true"."""
    terminating: bool = False
    demoted_at: datetime | None = None
    deletion_cost: int | None = None
    unschedulable: str | None = None
    """The scheduler's message when the pod is Pending as Unschedulable."""
    in_flight: int | None = None
    """Requests running or waiting in the engine; None when unknown (no metrics)."""
    serving_value: str = "true"
    """The `llmfleet.dev/serving` value while `serving`: "true", or "canary" for a canary's."""
    deployment: str | None = None
    """`llmfleet.dev/deployment`: the revision-named Deployment it belongs to (None: the
    pool's `<service>-<pool>`)."""


@dataclass(frozen=True)
class ObservedChild:
    """An object of a kind the operator writes that carries the service's label
    (`llmfleet.dev/service`): one of its children, or a look-alike (see `prune.ours`)."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str
    labels: Mapping[str, str] = field(default_factory=dict)
    controller_uid: str | None = None
    """uid of the owner reference marked `controller` (None without one)."""
    data: Mapping[str, str] = field(default_factory=dict)
    """A ConfigMap's data (empty for other kinds)."""
    body: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    """The object as the API server stored it, but for `metadata.managedFields` (`kept.py`):
    what `drift.drifted` compares a manifest with; None when not kept."""

    @property
    def pool(self) -> str | None:
        return self.labels.get(L.POOL)

    @property
    def key(self) -> tuple[str, str, str, str]:
        """Same shape as `failures.child_key` of a manifest."""
        return (self.api_version, self.kind, self.namespace, self.name)


@dataclass(frozen=True)
class Observed:
    pods: tuple[ObservedPod, ...] = ()
    service_monitor_crd: bool = False
    """The Prometheus Operator's ServiceMonitor CRD is installed."""
    conditions: tuple[Condition, ...] = ()
    """The service's current conditions (their transition times are kept when unchanged)."""
    autoscaling: AutoscalingStatus | None = None
    """`status.autoscaling`, written by the autoscaler."""
    revision: str = ""
    """`status.revision`: the stable revision."""
    stable_spec: StableSpec | None = None
    """`status.stableSpec`: what makes the stable revision's pods."""
    canary: CanaryStatus | None = None
    """`status.canary`: the rollout's state."""
    analysis: Analysis | None = None
    """The canary analysis taken for this pass (only when one was due)."""
    gpu_node_products: tuple[str, ...] | None = None
    """`nvidia.com/gpu.product` of every GPU node in the cluster, one entry per node; None when
    not looked at (it is only while a pod is unschedulable) or not allowed to list nodes."""

    children: tuple[ObservedChild, ...] = ()
    """Objects of the kinds the operator writes that carry the service's label."""
    ready_endpoints: Mapping[str, int] | None = None
    """Ready endpoints of each pool's Service (its EndpointSlices: what the gateway routes
    to); looked at only while a pool the spec no longer has still has children."""
    model_claims: tuple[tuple[str, str], ...] = ()
    """(namespace, name) of every service in the operator's view whose model name (the one
    clients send) is this service's, itself included, in claim order (`crds.claims`: the gateway
    routes the name to the first); empty when not looked at."""

    def pool_pods(self, pool: str) -> list[ObservedPod]:
        return [pod for pod in self.pods if pod.pool == pool and not pod.terminating]

    def retiring(self, pools: Collection[str]) -> int:
        """Pods (not yet terminating) of pools other than `pools`: a topology change retires
        them, and they hold their GPUs until they are gone."""
        return sum(1 for pod in self.pods if pod.pool not in pools and not pod.terminating)


def parse_time(value: str | None) -> datetime | None:
    """An RFC 3339 time as the API server writes it; None for none or one that does not parse."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def observed_pod(pod: Mapping[str, Any]) -> ObservedPod:
    """A pod as the API server sends it (JSON)."""
    meta, status = pod["metadata"], pod.get("status") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    ready = conditions.get("Ready") or {}
    scheduled = conditions.get("PodScheduled") or {}
    unschedulable = (
        scheduled.get("message") or "Unschedulable"
        if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable"
        else None
    )
    cost = annotations.get(L.DELETION_COST)
    serving = labels.get(L.SERVING)
    return ObservedPod(
        name=meta["name"],
        pool=labels.get(L.POOL, ""),
        created=parse_time(meta.get("creationTimestamp")) or datetime.now(UTC),
        ready=ready.get("status") == "True",
        serving=serving in ("true", L.SERVING_CANARY),
        serving_value=serving if serving == L.SERVING_CANARY else "true",
        deployment=labels.get(L.DEPLOYMENT),
        terminating=meta.get("deletionTimestamp") is not None,
        demoted_at=parse_time(annotations.get(L.DEMOTED_AT)),
        deletion_cost=int(cost) if cost and cost.lstrip("-").isdigit() else None,
        unschedulable=unschedulable,
    )


def rollout_status(status: Mapping[str, Any]) -> dict[str, Any]:
    """`status.revision`, `stableSpec` and `canary` as `Observed` fields; a part that no longer
    parses (written by another version) is left out: the rollout then starts from what the
    spec says, as for a new service."""
    found: dict[str, Any] = {"revision": str(status.get("revision") or "")}
    for key, name, model in (("stableSpec", "stable_spec", StableSpec),
                             ("canary", "canary", CanaryStatus)):  # fmt: skip
        try:
            found[name] = model.model_validate(status[key]) if status.get(key) else None
        except ValidationError:
            found[name] = None
    return found
