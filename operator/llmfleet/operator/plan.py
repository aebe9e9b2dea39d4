"""`desired(service, observed, settings, now) -> Plan`: the whole reconcile decision, pure.

No I/O here: the plan lists the objects to server-side apply, the pod labels to flip, the
status to write and the events to post; `reconcile.py` carries it out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from llmfleet.crds import Condition, InferenceService
from llmfleet.crds import labels as L
from llmfleet.crds.inference_service import ConditionStatus, PoolStatus
from llmfleet.operator import children
from llmfleet.operator.budget import PoolTarget, fit, surge
from llmfleet.operator.canary_plan import RolloutPlan, plan_rollout, rollout_conditions
from llmfleet.operator.children import Manifest
from llmfleet.operator.conditions import conditions, metrics_missing_in
from llmfleet.operator.failures import ChildFailure, child_key
from llmfleet.operator.observed import Observed, ObservedChild
from llmfleet.operator.pools import PodChange, PoolAssignment, draining
from llmfleet.operator.prune import ours, prune
from llmfleet.operator.rollout import Event
from llmfleet.operator.settings import OperatorSettings


@dataclass(frozen=True)
class Plan:
    objects: tuple[Manifest, ...]
    """Children to server-side apply."""
    deletions: tuple[ObservedChild, ...]
    """Children to delete: the spec no longer wants them (`prune.py`)."""
    pod_changes: tuple[PodChange, ...]
    status: dict[str, object]
    """Merge patch for the status subresource (never touches `status.autoscaling`)."""
    events: tuple[Event, ...]
    requeue_after: float | None
    """Look again this soon (a drain ends, pods are starting, a canary's analysis or deadline
    comes, MetricsMissing turns True): every state that changes with time alone says when;
    None: wait for a change (or the safety-net full resync, `handlers.py`)."""
    rollout: RolloutPlan | None = None
    """The rollout's decision and Deployments (for metrics and log lines)."""


def targets(
    service: InferenceService, observed: Observed, now: datetime, drain_seconds: float
) -> dict[str, PoolTarget]:
    """Active and spare pods per pool: the spec's replicas, or the autoscaler's decision
    (clamped to the pool's min/max) when autoscaling is on and it has decided; then cut to the
    GPU budget (`budget.fit`), pods still draining and pods of retiring pools counted as held."""
    spec = service.spec
    decided = observed.autoscaling.pools if observed.autoscaling else {}
    result: dict[str, PoolTarget] = {}
    for pool, pool_spec in spec.pools().items():
        active, spares, source = pool_spec.replicas, spec.autoscaling.warm_spares, "spec"
        if spec.autoscaling.enabled and pool in decided:
            decision = decided[pool]
            low = pool_spec.min_replicas or 0
            high = pool_spec.max_replicas if pool_spec.max_replicas is not None else 10**6
            active, spares, source = (
                min(max(decision.active, low), high),
                decision.spares,
                "autoscaler",
            )
        still = sum(draining(pod, now, drain_seconds) for pod in observed.pool_pods(pool))
        result[pool] = PoolTarget(active, spares, source, active, spares, still)
    retiring = observed.retiring(spec.pools())
    return fit(result, spec.runtime.gpu.count, spec.autoscaling.gpu_budget, retiring)


def desired(
    service: InferenceService,
    observed: Observed,
    settings: OperatorSettings,
    now: datetime,
    failures: Sequence[ChildFailure] = (),
) -> Plan:
    """The children, pod changes, status and events for one pass.

    The children do not depend on `failures`: a pass plans once, applies, and plans again with
    the children the API server refused, so that the status and events report them."""
    # The stable revision's Deployment per pool, and a canary's beside it (canary_plan.py).
    rollout = plan_rollout(
        service, observed, settings, now, targets(service, observed, now, settings.drain_seconds)
    )
    pools = rollout.stable_targets
    assignments: dict[str, PoolAssignment] = rollout.assignments

    config_map = children.config_map(service, retiring_configs(service, observed))
    config_map["data"] |= rollout.configs
    objects: list[Manifest] = [config_map, children.metrics_service(service)]
    if observed.service_monitor_crd:
        objects.append(children.service_monitor(service, settings))
    if settings.network_policy:
        objects.append(children.network_policy(service, settings, kv_transfer(service, observed)))
    pods = sum(track.assignment.replicas for track in rollout.tracks)
    spec = service.spec
    pods += observed.retiring(pools)
    extra = surge(pods, len(pools), spec.runtime.gpu.count, spec.autoscaling.gpu_budget)
    objects += rollout.children(service, settings, extra)

    pruning = prune(
        service, observed, wanted={child_key(o) for o in objects} | rollout.keep,
        replacements_serve=not failures and replacements_serve(pools, observed), now=now,
        drain_seconds=settings.drain_seconds,
    )  # fmt: skip
    refused = {(failure.kind, failure.name) for failure in failures}
    deletions = [c for c in pruning.deletions if (c.kind, c.name) not in refused]

    events: list[Event] = list(rollout.events)
    drain = settings.drain_seconds
    for pool, assignment in assignments.items():
        if assignment.promoted:
            promoted = ", ".join(assignment.promoted)
            wanted = pools[pool].active
            events.append(Event("Promoted", f"{pool}: promoted {promoted} ({wanted} active)"))
        if assignment.demoted:
            demoted = ", ".join(assignment.demoted)
            events.append(Event("Demoted", f"{pool}: demoted {demoted}; drains up to {drain}s"))
    for pool, assignment in pruning.draining.items():
        if assignment.demoted:
            demoted = ", ".join(assignment.demoted)
            events.append(Event("Demoted", f"{pool}: demoted {demoted}; drains up to {drain}s, "
                                "then the pool is removed (no longer in the spec)"))  # fmt: skip
    if deletions:
        deleted = ", ".join(f"{child.kind} {child.name}" for child in deletions)
        events.append(Event("Pruned", f"Deleted {deleted}: no longer in the spec"))

    published = endpoint(settings)
    now_conditions = conditions(
        service, observed, pools, assignments, now, failures=failures, pruning=pruning,
        endpoint=published, metrics_missing_after=settings.metrics_missing_seconds,
    )  # fmt: skip
    now_conditions = rollout_conditions(
        rollout, now_conditions, observed.conditions, now, service.metadata.get("generation")
    )
    said = {event.reason for event in events}
    events += [e for e in condition_events(observed, now_conditions) if e.reason not in said]

    # A merge patch keeps keys it does not name: a pool the spec dropped is removed by null.
    pool_status: dict[str, object] = dict.fromkeys(L.POOLS)
    pool_status |= {
        pool: PoolStatus(
            replicas=assignment.total,
            ready_replicas=assignment.ready,
            serving_replicas=assignment.serving,
            spare_replicas=assignment.spares,
        ).to_wire()
        for pool, assignment in assignments.items()
    }
    serving = " ".join(
        f"{pool} {assignment.serving}/{pools[pool].active}"
        for pool, assignment in assignments.items()
    )
    status: dict[str, object] = {
        "observedGeneration": service.metadata.get("generation"),
        "pools": pool_status,
        "serving": serving + rollout.serving(),
        "endpoint": published or "",  # the CRD defaults an absent endpoint to ""
        **rollout.status(),
        "conditions": [condition.to_wire() for condition in now_conditions],
    }
    settling = any(
        assignment.ready < assignment.total
        or assignment.replicas != assignment.total
        or assignment.serving < pools[pool].active
        or assignment.changes
        for pool, assignment in assignments.items()
    )
    draining = any(
        assignment.replicas > pools[pool].active + pools[pool].spares
        for pool, assignment in assignments.items()
    )
    removing = pruning.draining or pruning.waiting or pruning.removed
    pools_wait = 2.0 if settling or draining or removing else None
    missing_in = metrics_missing_in(service, observed, now, settings.metrics_missing_seconds)
    requeue = rollout.requeue(min((w for w in (pools_wait, missing_in) if w is not None),
                                  default=None))  # fmt: skip
    pod_changes = rollout.pod_changes(tuple(pruning.draining.values()))
    return Plan(tuple(objects), tuple(deletions), pod_changes, status, tuple(events), requeue,
                rollout)  # fmt: skip


def retiring_configs(service: InferenceService, observed: Observed) -> dict[str, str]:
    """The runtime configs (file name -> text) of pools a topology change retires, as the
    runtime ConfigMap holds them now: kept until the pool's children are gone, so an engine of
    the old pool that restarts meanwhile still finds its config."""
    pools = service.spec.pools()
    retiring = {c.pool for c in observed.children if c.pool and c.pool not in pools}
    name = children.child_name(service, "runtime")
    current = next(
        (c.data for c in observed.children
         if c.kind == "ConfigMap" and c.name == name and ours(c, service)),
        {},
    )  # fmt: skip
    return {
        f"{pool}.json": current[f"{pool}.json"] for pool in retiring if f"{pool}.json" in current
    }


def replacements_serve(pools: dict[str, PoolTarget], observed: Observed) -> bool:
    """Whether pools the spec no longer has may drain: every pool of the spec has its target
    of ready endpoints (counted in the EndpointSlices, which the gateway routes by, not in pod
    labels, which reach them a moment later).

    NOTE: make-before-break needs GPUs for the old pools and the new at once; when pods of the
    new pools wait unschedulable, the old pools (which may hold those GPUs) go first."""
    if any(pod.unschedulable for pool in pools for pod in observed.pool_pods(pool)):
        return True
    endpoints = observed.ready_endpoints or {}
    return all(endpoints.get(pool, 0) >= target.active for pool, target in pools.items())


PROBLEM_CONDITIONS = ("Degraded", "ScalingLimited", "MetricsMissing", "ModelNameConflict",
                      "RolloutAnnotationUnknown")  # fmt: skip
"""Conditions that are bad when True (Ready is bad when False)."""


def _bad(condition: Condition) -> bool:
    return (condition.type in PROBLEM_CONDITIONS) == (condition.status == ConditionStatus.TRUE)


def condition_events(observed: Observed, now_conditions: list[Condition]) -> list[Event]:
    """An event whenever Ready or Degraded changes status or reason, and whenever
    ScalingLimited, MetricsMissing, ModelNameConflict or RolloutAnnotationUnknown turns True,
    changes reason or turns back
    (not on every pass); a Warning when the new state is bad.
    One event when several change to the same reason and message (a problem that makes the
    service not Ready and Degraded is said once)."""
    before = {condition.type: condition for condition in observed.conditions}
    changed: list[Condition] = []
    for condition in now_conditions:
        old = before.get(condition.type)
        if old is not None and (old.status, old.reason) == (condition.status, condition.reason):
            continue
        if condition.type in ("Ready", "Degraded") or (
            condition.type in PROBLEM_CONDITIONS[1:] and (_bad(condition) or old is not None)
        ):
            changed.append(condition)
    events: list[Event] = []
    for condition in changed:
        said = (condition.reason, condition.message)
        same = [c for c in changed if (c.reason, c.message) == said]
        if condition is not same[0]:
            continue
        states = ", ".join(f"{c.type}={c.status.value}" for c in same)
        bad = any(_bad(c) for c in same)
        events.append(Event(condition.reason, f"{states}: {condition.message}", warning=bad))
    return events


def kv_transfer(service: InferenceService, observed: Observed) -> bool:
    """Whether the service's prefill and decode pods must reach each other: it is
    Disaggregated, or was until lately and its old prefill or decode pods still serve while
    the new pools start (make-before-break), with requests in flight between them."""
    pools = {*service.spec.pools(), *(pod.pool for pod in observed.pods)}
    return any(pool in pools for pool in children.KV_TRANSFER_POOLS)


def endpoint(settings: OperatorSettings) -> str | None:
    """`status.endpoint`: the gateway's URL, or None (removed by the merge patch) when the
    operator has none. Never a pool Service: its NetworkPolicy admits only the gateway."""
    return settings.gateway_url or None
