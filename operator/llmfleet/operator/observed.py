"""What the operator saw of one InferenceService's world (plain data; filled by `observe.py`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from llmfleet.crds.inference_service import AutoscalingStatus, Condition


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


@dataclass(frozen=True)
class Observed:
    pods: tuple[ObservedPod, ...] = ()
    service_monitor_crd: bool = False
    """The Prometheus Operator's ServiceMonitor CRD is installed."""
    conditions: tuple[Condition, ...] = ()
    """The service's current conditions (their transition times are kept when unchanged)."""
    autoscaling: AutoscalingStatus | None = None
    """`status.autoscaling`, written by the autoscaler."""
    gpu_node_products: tuple[str, ...] | None = None
    """`nvidia.com/gpu.product` of every GPU node in the cluster, one entry per node; None when
    not looked at (it is only while a pod is unschedulable) or not allowed to list nodes."""

    def pool_pods(self, pool: str) -> list[ObservedPod]:
        return [pod for pod in self.pods if pod.pool == pool and not pod.terminating]
