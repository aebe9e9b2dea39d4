"""What the operator saw of one InferenceService's world (plain data; filled by `kube.py`)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

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
