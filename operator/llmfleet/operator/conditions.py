"""Status conditions (pure): Ready, Progressing, Degraded, ScalingLimited, MetricsMissing,
ModelNameConflict and RolloutAnnotationUnknown, with reasons and messages a person can act on.
A condition keeps its lastTransitionTime while its status holds.

Ready means serving: every pool serves its (non-zero) target. Degraded names a problem: children
the API server refused, pods the scheduler cannot place. ScalingLimited gives the figures when
the GPU budget (or, by its own account, the autoscaler) holds a pool below what is wanted."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime

from llmfleet.crds import Condition, InferenceService
from llmfleet.crds import labels as L
from llmfleet.crds.gpus import GPU_PRODUCT_LABEL, GPU_TYPES, gpu_type_of
from llmfleet.crds.inference_service import ConditionStatus
from llmfleet.operator.budget import PoolTarget, gpus_held, limit_message
from llmfleet.operator.failures import ChildFailure
from llmfleet.operator.observed import Observed, parse_time
from llmfleet.operator.pools import PoolAssignment
from llmfleet.operator.prune import Pruning
from llmfleet.operator.rollout import unknown_pause


def _unschedulable(observed: Observed) -> dict[str, list[str]]:
    """Scheduler messages of Pending pods per pool."""
    found: dict[str, list[str]] = {}
    for pod in observed.pods:
        if pod.unschedulable and not pod.terminating:
            found.setdefault(pod.pool, []).append(pod.unschedulable)
    return found


def _no_matching_nodes(service: InferenceService, observed: Observed, pending: int) -> str | None:
    """What to say when no node carries a GPU product the service selects, or None when one
    does (or the nodes are unknown, or the service selects by a label other than GFD's). The
    scheduler only says the node affinity matched nothing.

    NOTE: only the GPU product is checked. A pool's own nodeSelector may still rule out every
    node of the right product, or no node may offer the MIG slice; the pods are then
    Unschedulable with the scheduler's words."""
    gpu = service.spec.runtime.gpu
    products = gpu.node_products()
    if gpu.node_label is not None or observed.gpu_node_products is None:
        return None
    if any(product in observed.gpu_node_products for product in products):
        return None
    counts = Counter(observed.gpu_node_products)
    which = f"={products[0]}" if len(products) == 1 else f" one of {', '.join(products)}"
    memory = "" if gpu.min_memory_gb is None or gpu.mig else f" with {gpu.min_memory_gb} GB"
    named = gpu.type.value if gpu.products is None else "the listed"
    missing = f"No node has {named} GPUs{memory} ({GPU_PRODUCT_LABEL}{which}), so {pending} pod(s)"
    if not counts:
        return (
            f"{missing} cannot be scheduled; the cluster has no GPU nodes (none is labelled "
            f"{GPU_PRODUCT_LABEL}). Add nodes with {named} GPUs{memory}."
        )
    have = ", ".join(
        f"{gpu_type_of(other)} ({GPU_PRODUCT_LABEL}={other}) on {n} node(s)"
        for other, n in sorted(counts.items())
    )
    usable = [
        name for name, known in GPU_TYPES.items() if any(p.label in counts for p in known.products)
    ]
    choice = usable[0] if len(usable) == 1 else f"one of {', '.join(usable)}"
    change = f"Set spec.runtime.gpu.type to {choice}, or add" if usable else "Add"
    if memory:
        change = f"Lower spec.runtime.gpu.minMemoryGB, {change[0].lower()}{change[1:]}"
    return (
        f"{missing} cannot be scheduled; the cluster's GPU nodes have {have}. "
        f"{change} nodes with {named} GPUs{memory}."
    )


SHOWN_FAILURES = 3
"""Refused children quoted in a condition's message; the rest are counted."""
QUOTED_CHARACTERS = 1000
"""How much of each API server message is quoted (the condition's message holds 4096)."""


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _refused(failures: Sequence[ChildFailure]) -> tuple[str, str] | None:
    """Reason and message when the API server refused children: `InvalidSpec` when it found one
    invalid (422), `ApplyFailed` for any other refusal (forbidden by quota or policy, …)."""
    if not failures:
        return None
    reason = "InvalidSpec" if any(failure.invalid for failure in failures) else "ApplyFailed"
    quoted = "; ".join(
        _clip(failure.describe(), QUOTED_CHARACTERS) for failure in failures[:SHOWN_FAILURES]
    )
    more = len(failures) - SHOWN_FAILURES
    message = (
        f"The API server refused {len(failures)} child object(s) of this service: {quoted}"
        + (f"; and {more} more" if more > 0 else "")
        + ". The other children were applied; the refused ones are tried again with back-off, "
        "at once when the spec changes."
    )
    return reason, message


Said = tuple[ConditionStatus, str, str]
"""A condition's status, reason and message."""


def _ready(
    targets: Mapping[str, PoolTarget],
    assignments: Mapping[str, PoolAssignment],
    problem: tuple[str, str] | None,
    summary: str,
) -> Said:
    """Ready means serving: True only while every pool serves its target and that target is
    not zero (a pool without pods cannot answer: prefill without decode serves nothing)."""
    zero = {pool: target for pool, target in targets.items() if target.active == 0}
    if zero:
        why = ", ".join(f"{pool} ({_zero_because(pool, target)})" for pool, target in zero.items())
        message = (f"Scaled to zero, so the service cannot answer: no pod serves in {why}. "
                   "Set replicas to 1 or more to serve.")  # fmt: skip
        return ConditionStatus.FALSE, "ScaledToZero", message
    if all(a.serving >= targets[pool].active for pool, a in assignments.items()):
        return ConditionStatus.TRUE, "Serving", f"All pools serve: {summary}."
    if problem is not None:
        return ConditionStatus.FALSE, problem[0], problem[1]
    idle = [pool for pool, a in assignments.items() if a.serving == 0]
    if idle:
        starting = sum(assignments[pool].total - assignments[pool].ready for pool in idle)
        message = (f"No pod serves in {', '.join(idle)}, so the service cannot answer: "
                   f"{summary}; {starting} pod(s) starting (engines load, warm up).")  # fmt: skip
        return ConditionStatus.FALSE, "NoServingReplicas", message
    message = f"Waiting for engine pods to load and warm up: {summary}."
    return ConditionStatus.FALSE, "PodsStarting", message


def _zero_because(pool: str, target: PoolTarget) -> str:
    if target.cut:
        return f"the GPU budget leaves it none of the {target.wanted_active} wanted"
    if target.source == "autoscaler":
        return "the autoscaler's decision"
    return f"spec.topology.{pool}.replicas is 0"


def _scaling_limited(
    service: InferenceService, observed: Observed, targets: Mapping[str, PoolTarget]
) -> Said | None:
    """True with the figures while the GPU budget cuts what the spec or the autoscaler wants,
    or while the autoscaler says it is limited; present once a budget or an autoscaler
    decision exists."""
    budget = service.spec.autoscaling.gpu_budget
    gpus = service.spec.runtime.gpu.count
    autoscaler = observed.autoscaling
    said_by_autoscaler = autoscaler.message if autoscaler and autoscaler.limited else ""
    if budget is not None and any(target.cut for target in targets.values()):
        retiring = observed.retiring(service.spec.pools())
        message = limit_message(dict(targets), gpus, budget, retiring)
        if said_by_autoscaler:
            message += f" The autoscaler says: {said_by_autoscaler}"
        return ConditionStatus.TRUE, "GPUBudget", message
    if said_by_autoscaler:
        return ConditionStatus.TRUE, "AutoscalerLimited", said_by_autoscaler
    within = []
    if budget is not None:
        held = gpus_held(dict(targets), gpus, observed.retiring(service.spec.pools()))
        within.append(f"The pools hold {held} of the GPU budget's {budget} GPUs.")
    if autoscaler is not None:
        within.append("The autoscaler is not limited.")
    return (ConditionStatus.FALSE, "WithinLimits", " ".join(within)) if within else None


def _progressing(settling: list[str], summary: str, pruning: Pruning | None) -> Said:
    """Scaling while a pool of the spec settles, RemovingPools while a pool the spec no longer
    has drains or goes (or waits, once nothing else settles), else Stable."""
    going, waiting = [], ""
    if pruning is not None:
        going = [f"{pool} ({a.replicas} pod(s) draining)" for pool, a in pruning.draining.items()]
        going += [f"{pool} (drained, deleted now)" for pool in pruning.removed]
        waiting = ", ".join(pruning.waiting)
    if going:
        removing = ", ".join(going)
        message = f"Removing pools the spec no longer has: {removing}; {summary}."
        return ConditionStatus.TRUE, "RemovingPools", message
    if settling:
        until = f" {waiting} keep(s) serving until then." if waiting else ""
        message = f"Pools settling: {', '.join(settling)} ({summary}).{until}"
        return ConditionStatus.TRUE, "Scaling", message
    if waiting:
        message = f"{waiting} no longer in the spec, kept until every child is applied; {summary}."
        return ConditionStatus.TRUE, "RemovingPools", message
    return ConditionStatus.FALSE, "Stable", f"Every pool runs its target ({summary})."


def _endpoint_published(
    service: InferenceService, endpoint: str | None
) -> tuple[ConditionStatus, str, str]:
    """Whether `status.endpoint` names the gateway, and what to do when it cannot."""
    model = service.spec.served_name
    if endpoint:
        message = f"Requests for model `{model}` go to the gateway at {endpoint}."
        return (ConditionStatus.TRUE, "GatewayURL", message)
    return (
        ConditionStatus.FALSE,
        "NoGatewayURL",
        "No endpoint is published: the operator has no gateway URL "
        f"(LLMFLEET_OPERATOR_GATEWAY_URL). Send requests for model `{model}` to the llmfleet "
        "gateway; the pool Services are its upstreams, without API keys or limits.",
    )


STALLED_REASONS = frozenset({"InvalidSpec", "ApplyFailed", "NoMatchingGPUNodes"})
"""Problems that need a person (a spec or cluster change), not time: kstatus calls them Failed."""


def _kstatus(ready: Said, problem: tuple[str, str] | None) -> dict[str, Said]:
    """`Reconciling` and `Stalled`, the abnormal-true conditions kstatus reads (Flux's health
    checks, `kstatus`-based tools; they ignore Ready): Reconciling while the service is not
    Ready and is expected to get there (engines starting, pods waiting for GPUs, scaled to
    zero on purpose is not that); Stalled while a problem only a person can fix stands."""
    if problem is not None and problem[0] in STALLED_REASONS:
        stalled: Said = (ConditionStatus.TRUE, problem[0], problem[1])
    else:
        stalled = (ConditionStatus.FALSE, "AsExpected", "Nothing blocks the service.")
    status, reason, message = ready
    if status == ConditionStatus.TRUE or reason == "ScaledToZero" or stalled[0] == "True":
        reconciling: Said = (ConditionStatus.FALSE, reason, "Nothing is under way.")
    else:
        reconciling = (ConditionStatus.TRUE, reason, message)
    return {"Reconciling": reconciling, "Stalled": stalled}


METRICS_MISSING_HINT = (
    "Check that the service's ServiceMonitor <name>-metrics carries the labels your Prometheus "
    "selects ServiceMonitors by (LLMFLEET_OPERATOR_SERVICE_MONITOR_LABELS; the chart's "
    "monitoring.serviceMonitors.labels), and that the NetworkPolicy <name>-engines admits your "
    "Prometheus pods (LLMFLEET_OPERATOR_PROMETHEUS_NAMESPACE and _POD_LABELS). Until then the "
    "autoscaler holds every pool and a canary gets no verdict."
)


def _metrics_missing(service: InferenceService, observed: Observed, now: datetime,
                     after_seconds: float) -> Said | None:  # fmt: skip
    """MetricsMissing, for an autoscaled service: True once the autoscaler has found no engine
    series for a pool with Ready pods for `after_seconds` (`status.autoscaling.
    metricsMissingSince`), else False. None (no condition) without autoscaling: nothing else
    reads the engines' series continuously."""
    if not service.spec.autoscaling.enabled:
        return None
    status = observed.autoscaling
    since_text = status.metrics_missing_since if status is not None else None
    since = parse_time(since_text)
    if since is None or (now - since).total_seconds() < after_seconds:
        return (ConditionStatus.FALSE, "SeriesArrive", "The engines' series reach Prometheus.")
    pools = ", ".join((status.metrics_missing_pools if status else None) or []) or "its pools"
    seconds = (now - since).total_seconds()
    lasted = f"{seconds:.0f} seconds" if seconds < 120 else f"{seconds / 60:.0f} minutes"
    return (
        ConditionStatus.TRUE,
        "NoEngineSeries",
        f"Prometheus has had no engine series for {pools} for {lasted} (since "
        f"{since_text}), though their pods are Ready. {METRICS_MISSING_HINT}",
    )


def metrics_missing_in(
    service: InferenceService, observed: Observed, now: datetime, after_seconds: float
) -> float | None:
    """Seconds until MetricsMissing turns True by itself (`_metrics_missing`: the autoscaler's
    `metricsMissingSince` plus `after_seconds` passes, with no change to wake the service), for
    the plan's requeue; None when it is not on its way (no autoscaling, series arriving, or
    True already)."""
    status = observed.autoscaling
    since = parse_time(status.metrics_missing_since if status is not None else None)
    if not service.spec.autoscaling.enabled or since is None:
        return None
    left = after_seconds - (now - since).total_seconds()
    return left if left > 0 else None


def _model_name_conflict(service: InferenceService, observed: Observed) -> Said | None:
    """ModelNameConflict: True while another service claims this one's model name (the gateway
    routes the name to the first created, `crds.claims`), False once no other does; None (no
    condition) for a service that never had a conflict."""
    model = service.spec.served_name
    claims = observed.model_claims
    me = (service.metadata.get("namespace", ""), service.metadata.get("name", ""))
    others = [claim for claim in claims if claim != me]
    if not others:
        if any(c.type == "ModelNameConflict" for c in observed.conditions):
            return (ConditionStatus.FALSE, "ModelNameUnique",
                    f"No other service claims the model name {model!r}.")  # fmt: skip
        return None
    named = ", ".join(f"{namespace}/{name}" for namespace, name in others)
    if claims[0] == me:
        return (
            ConditionStatus.TRUE, "ModelNameShared",
            f"{named} also claim(s) the model name {model!r}; the gateway routes it to this "
            "service (created first) and none to them. Give each service a model name of its "
            "own (spec.model.servedName).",
        )  # fmt: skip
    first = "{}/{}".format(*claims[0])
    return (
        ConditionStatus.TRUE, "ModelNameTaken",
        f"The model name {model!r} is claimed by {named}; the gateway routes it to {first} "
        "(created first) and none to this service. Set spec.model.servedName to a name of its "
        "own.",
    )  # fmt: skip


def _rollout_annotation(service: InferenceService, observed: Observed) -> Said | None:
    """RolloutAnnotationUnknown: True while `rollout-pause` holds a value the operator does not
    read (an object kept from before the admission policy: `True`, `yes`), False once it no
    longer does; None (no condition) for a service that never had one."""
    annotations = service.metadata.get("annotations") or {}
    value = unknown_pause(dict(annotations)) if isinstance(annotations, dict) else None
    if value is None:
        if any(c.type == "RolloutAnnotationUnknown" for c in observed.conditions):
            return (ConditionStatus.FALSE, "AnnotationsUnderstood",
                    f"{L.ROLLOUT_PAUSE} is absent, \"true\" or \"false\".")  # fmt: skip
        return None
    return (
        ConditionStatus.TRUE, "UnknownPauseValue",
        f"metadata.annotations[{L.ROLLOUT_PAUSE}] is {value!r}, which the operator does not "
        "read: the rollout is not paused. Write \"true\" to hold the canary at its step, or "
        "\"false\" (or remove the annotation) to let it go on.",
    )  # fmt: skip


def conditions(
    service: InferenceService,
    observed: Observed,
    targets: Mapping[str, PoolTarget],
    assignments: Mapping[str, PoolAssignment],
    now: datetime,
    *,
    failures: Sequence[ChildFailure] = (),
    pruning: Pruning | None = None,
    endpoint: str | None = None,
    metrics_missing_after: float = 300.0,
) -> list[Condition]:
    generation = service.metadata.get("generation")
    gpus = service.spec.runtime.gpu
    short = {pool: a.serving < targets[pool].active for pool, a in assignments.items()}
    pending = _unschedulable(observed)
    gpu_pending = {
        pool: msgs for pool, msgs in pending.items() if any(gpus.resource() in msg for msg in msgs)
    }
    summary = ", ".join(
        f"{pool} {a.serving}/{targets[pool].active} serving" for pool, a in assignments.items()
    )

    no_nodes = _no_matching_nodes(service, observed, sum(map(len, pending.values())))
    refused = _refused(failures)
    if refused is not None:
        problem: tuple[str, str] | None = refused
    elif pending and no_nodes is not None:
        problem = ("NoMatchingGPUNodes", no_nodes)
    elif gpu_pending:
        pool, messages = next(iter(gpu_pending.items()))
        count = sum(len(msgs) for msgs in gpu_pending.values())
        problem = (
            "InsufficientGPU",
            f"{count} pod(s) need {gpus.count} x {gpus.type.value} GPU"
            f"{f' MIG slice {gpus.mig}' if gpus.mig else ''} each and cannot be "
            f"scheduled ({pool}: {messages[0].strip()}). Add GPU nodes, or lower replicas or "
            "runtime.gpu.count.",
        )
    elif pending:
        pool, messages = next(iter(pending.items()))
        problem = ("Unschedulable", f"{pool} pods cannot be scheduled: {messages[0].strip()}")
    else:
        problem = None

    if refused is not None:
        ready = (ConditionStatus.FALSE, refused[0], refused[1])
    else:
        ready = _ready(targets, assignments, problem, summary)

    settling = [
        pool
        for pool, a in assignments.items()
        if a.total != a.replicas or a.ready < a.total or short[pool]
    ]
    progressing = _progressing(settling, summary, pruning)
    degraded = (
        (ConditionStatus.TRUE, problem[0], problem[1])
        if problem is not None
        else (ConditionStatus.FALSE, "AsExpected", "No problems seen.")
    )
    wanted = {"Ready": ready, "Progressing": progressing, "Degraded": degraded}
    wanted |= _kstatus(ready, problem)
    wanted["EndpointPublished"] = _endpoint_published(service, endpoint)
    limited = _scaling_limited(service, observed, targets)
    if limited is not None:
        wanted["ScalingLimited"] = limited
    missing = _metrics_missing(service, observed, now, metrics_missing_after)
    if missing is not None:
        wanted["MetricsMissing"] = missing
    conflict = _model_name_conflict(service, observed)
    if conflict is not None:
        wanted["ModelNameConflict"] = conflict
    annotation = _rollout_annotation(service, observed)
    if annotation is not None:
        wanted["RolloutAnnotationUnknown"] = annotation

    previous = {condition.type: condition for condition in observed.conditions}
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    result = []
    for kind, (status, reason, message) in wanted.items():
        before = previous.get(kind)
        since = before.last_transition_time if before and before.status == status else stamp
        result.append(
            Condition(
                type=kind,
                status=status,
                reason=reason,
                message=message,
                last_transition_time=since,
                observed_generation=generation,
            )
        )
    return result
