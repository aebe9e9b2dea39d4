"""Warm spares (pure): which pods of a pool serve, which wait as spares, how many pods to run.

A pool runs `active + spares` pods. Pods start as spares (`llmfleet.dev/serving: "false"`, the
pod template's value) and are promoted by flipping the label once Ready, so the pool's Service
(which selects `"true"`) sends them traffic within seconds. Scaling down demotes a serving pod:
it leaves the Service at once, but it is kept (and counted on top of the target) until it has
drained — no requests in flight, or the drain period is over. Only then may the ReplicaSet
remove a pod, and `pod-deletion-cost` makes it remove spares first.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from llmfleet.operator.observed import ObservedPod

COST_SERVING = 1000
COST_DRAINING = 500
COST_SPARE = 0


@dataclass(frozen=True)
class PodChange:
    """The labels and annotations the operator wants on one pod (applied only when different)."""

    name: str
    serving: bool
    demoted_at: datetime | None
    deletion_cost: int
    serving_value: str = "true"
    """`llmfleet.dev/serving` while serving: "true" (the pool Service) or "canary"."""


@dataclass(frozen=True)
class PoolAssignment:
    replicas: int
    """Pods the Deployment should run: target plus pods still draining."""
    changes: tuple[PodChange, ...]
    promoted: tuple[str, ...]
    demoted: tuple[str, ...]
    serving: int
    """Ready pods serving after the changes."""
    spares: int
    """Ready pods kept out of traffic after the changes (draining ones included)."""
    ready: int
    total: int


ENDPOINT_PROPAGATION_SECONDS = 5.0
"""A demoted pod drains at least this long, even with nothing in flight: it leaves its Service's
EndpointSlice at once, but what routes by EndpointSlices learns it later (the gateway lists them
every second; kube-proxy and ingress controllers take seconds too) and may still send it a
request meanwhile — the reason pods get a preStop sleep. Without it the last pod of a pool that a
topology change retires could be gone while the gateway still routes there."""


def draining(pod: ObservedPod, now: datetime, drain_seconds: float) -> bool:
    """A demoted pod drains until it reports nothing in flight or the drain period ends, and at
    least `ENDPOINT_PROPAGATION_SECONDS` (never beyond the drain period)."""
    if pod.demoted_at is None or pod.serving:
        return False
    elapsed = (now - pod.demoted_at).total_seconds()
    if elapsed < min(drain_seconds, ENDPOINT_PROPAGATION_SECONDS):
        return True
    if pod.in_flight == 0:
        return False
    return elapsed < drain_seconds


def assign(
    pods: list[ObservedPod],
    active: int,
    spares: int,
    now: datetime,
    drain_seconds: float,
    *,
    serving_value: str = "true",
) -> PoolAssignment:
    """Decide serving/spare for every (non-terminating) pod of one pool (or of one revision's
    Deployment of it: a canary's pods serve as `serving_value` "canary")."""
    by_age = sorted(pods, key=lambda pod: (pod.created, pod.name))
    serving_ready = [pod for pod in by_age if pod.serving and pod.ready]
    keep = serving_ready[:active]
    demote = serving_ready[active:]
    candidates = [
        pod
        for pod in by_age
        if pod.ready and not pod.serving and not draining(pod, now, drain_seconds)
    ]
    promote = candidates[: max(0, active - len(keep))]

    serving_names = {pod.name for pod in (*keep, *promote)}
    # A serving pod that is not Ready keeps its label: Kubernetes already takes it out of the
    # EndpointSlice, and it serves again when it recovers (then the surplus is demoted).
    serving_names |= {pod.name for pod in by_age if pod.serving and not pod.ready}
    demoted_names = {pod.name for pod in demote}

    changes: list[PodChange] = []
    still_draining = 0
    for pod in by_age:
        if pod.name in serving_names:
            wanted = PodChange(pod.name, True, None, COST_SERVING, serving_value)
        elif pod.name in demoted_names:
            wanted = PodChange(pod.name, False, now, COST_DRAINING, serving_value)
            still_draining += 1
        elif draining(pod, now, drain_seconds):
            wanted = PodChange(pod.name, False, pod.demoted_at, COST_DRAINING, serving_value)
            still_draining += 1
        else:
            wanted = PodChange(pod.name, False, None, COST_SPARE, serving_value)
        value = pod.serving_value if pod.serving else serving_value
        current = PodChange(pod.name, pod.serving, pod.demoted_at, pod.deletion_cost or 0, value)
        if wanted != current:
            changes.append(wanted)

    ready = [pod for pod in by_age if pod.ready]
    serving_after = sum(1 for pod in ready if pod.name in serving_names)
    return PoolAssignment(
        replicas=active + spares + still_draining,
        changes=tuple(changes),
        promoted=tuple(pod.name for pod in promote),
        demoted=tuple(pod.name for pod in demote),
        serving=serving_after,
        spares=len(ready) - serving_after,
        ready=len(ready),
        total=len(by_age),
    )
