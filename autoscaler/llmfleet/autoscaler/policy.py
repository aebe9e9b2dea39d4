"""The autoscaling policy: one pure function from what was observed to replica counts.

`decide(inputs, state, now)` sizes every pool of one InferenceService and returns the decision
(what `status.autoscaling` takes) and the state to pass to the next call. No I/O and no clock of
its own: production, the simulator and the tests run the same code at the times they choose.

Per pool, in order:
1. fail-static: signals missing, or older than `stale_after_s`: keep the current counts;
2. forecast the request rate (`forecast`), learn the capacity correction from the goodput (the
   share of requests over each target, `goodput`), or the p95 where no histogram is exported
   (frozen while pods are starting: their latency has not caught up yet);
3. size the pool (`sizing`), clamp to min/max replicas (`floor`: minReplicas, or when unset 2
   until the pool's load is measured light, then 1);
4. up at once, unless Pending pods cannot be scheduled (then hold: more would pend too);
   down only once the need stayed lower for `scaleDownStabilizationSeconds`, and then to the
   highest need seen over that window, never during a burst;
5. warm spares on top; finally every pool together into the GPU budget (`budget`).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from llmfleet.autoscaler.budget import Wish, fit
from llmfleet.autoscaler.capacity import Evidence, default_capacity, learn, profiled_capacity
from llmfleet.autoscaler.decision import Decision, PoolDecision
from llmfleet.autoscaler.floor import floor
from llmfleet.autoscaler.forecast import Forecast, forecast
from llmfleet.autoscaler.goodput import (
    LatencyHistogram,
    Round,
    capacity_misses,
    implied_ratio,
    over,
    wilson_lower,
)
from llmfleet.autoscaler.inputs import (
    PolicyConfig,
    PolicyState,
    PoolInputs,
    PoolPods,
    PoolSignals,
    PoolState,
    ServiceInputs,
)
from llmfleet.autoscaler.promote import promotion
from llmfleet.autoscaler.sizing import Need, decode_need, prefill_need
from llmfleet.crds.inference_service import InferenceServiceSpec, SloMisses
from llmfleet.crds.spec import PoolSpec

_PREFILL_ROLES = ("prefill", "unified")
_DECODE_ROLES = ("decode", "unified")
_MIN_RATE = 1e-3
"""Requests per second below which a pool counts as idle for the forecast."""
_MAX_REPLICAS = 1000
"""The schema's bound on maxReplicas, used when a pool sets none (the GPU budget still binds)."""


def decide(
    inputs: ServiceInputs,
    state: PolicyState,
    now: datetime,
    config: PolicyConfig | None = None,
) -> Decision:
    config = config or PolicyConfig()
    spec = inputs.spec
    plans: dict[str, PoolDecision] = {}
    states: dict[str, PoolState] = dict(state.pools)
    wishes: dict[str, Wish] = {}
    for name, pool_spec in spec.pools().items():
        pool = inputs.pools.get(name)
        minimum = pool_spec.min_replicas if pool_spec.min_replicas is not None else 1
        if pool is None:
            plan = PoolDecision(
                pool_spec.replicas,
                spec.autoscaling.warm_spares,
                f"holding {pool_spec.replicas}: the pool has not been observed yet",
            )
            wishes[name] = Wish(plan.active, plan.spares, plan.active, minimum, False)
        else:
            plan, held, states[name] = _pool(
                name, pool_spec, pool, spec=spec, state=state.pool(name), now=now, config=config
            )
            wishes[name] = Wish(plan.active, plan.spares, pool.pods.active, minimum, not held)
        plans[name] = plan

    gpus = spec.runtime.gpu.count
    budget = spec.autoscaling.gpu_budget
    fitted = fit(wishes, gpus, budget)
    for name, wish in fitted.items():
        before = wishes[name]
        if (wish.active, wish.spares) != (before.active, before.spares):
            plan = plans[name]
            cut = (
                f"GPU budget {budget} reached ({gpus} GPU per pod): "
                f"{before.active} -> {wish.active} active, {before.spares} -> {wish.spares} spares"
            )
            plans[name] = _cut(plan, wish, cut)
    if budget is not None and sum((w.active + w.spares) * gpus for w in fitted.values()) > budget:
        first = next(iter(plans))
        over = f"minReplicas and held pools need more than the GPU budget {budget}"
        plans[first] = replace(
            plans[first], limited="; ".join(x for x in (plans[first].limited, over) if x)
        )
    return Decision(plans, PolicyState(states), now)


def decide_fast(
    inputs: ServiceInputs,
    state: PolicyState,
    now: datetime,
    config: PolicyConfig | None = None,
) -> Decision:
    """The fast pass between full passes: scale up only, never learn, never start a window.

    `inputs` carry the last full pass's rates and latencies with fresh gauges (running and
    waiting requests, KV-cache usage, pod counts) read every second or two. Per pool, the
    larger of:
    - the full sizing on those gauges (a queue the pool cannot clear within the TTFT target is
      the prefill need's backlog term), on the tick that sees it instead of up to one full
      interval later;
    - one warm spare promoted on requests queued in the engines (`promote.py`), whatever the
      sizing model believes: promoting is a label flip, and the full pass's scale-down undoes it.
    Every other pool keeps its counts; the GPU budget then binds as in `decide`. The state
    passed in is the state returned: the full pass alone learns, forecasts and scales down."""
    config = config or PolicyConfig()
    full = decide(inputs, state, now, config)
    plans: dict[str, PoolDecision] = {}
    wishes: dict[str, Wish] = {}
    pool_specs = inputs.spec.pools()
    for name, plan in full.pools.items():
        pool = inputs.pools.get(name)
        if pool is None:
            # Its counts stand (the full pass holds it too), and they count against the budget.
            plans[name] = PoolDecision(plan.active, plan.spares, "fast pass: not observed yet")
            wishes[name] = Wish(plan.active, plan.spares, plan.active, plan.active, False)
            continue
        current = pool.pods
        promote = promotion(pool, pool_specs[name].max_replicas, config)
        if plan.active > current.active:
            plans[name] = replace(plan, reason=f"fast pass: {plan.reason}")
        elif promote:
            plans[name] = PoolDecision(
                current.active + 1, current.spares, f"fast pass: {promote}",
                ttft_misses=plan.ttft_misses,
            )  # fmt: skip
        else:
            reason = f"fast pass: holding {current.active}"
            plans[name] = PoolDecision(
                current.active, current.spares, reason, ttft_misses=plan.ttft_misses
            )
        minimum = pool_specs[name].min_replicas or 0
        wishes[name] = Wish(plans[name].active, plans[name].spares, current.active, minimum, True)
    gpus, budget = inputs.spec.runtime.gpu.count, inputs.spec.autoscaling.gpu_budget
    for name, wish in fit(wishes, gpus, budget).items():
        plan = plans[name]
        if (wish.active, wish.spares) != (plan.active, plan.spares):
            cut = f"GPU budget {budget} reached ({gpus} GPU per pod)"
            plans[name] = _cut(plan, wish, cut)
    return Decision(plans, state, now)


def _pool(
    name: str,
    pool_spec: PoolSpec,
    pool: PoolInputs,
    *,
    spec: InferenceServiceSpec,
    state: PoolState,
    now: datetime,
    config: PolicyConfig,
) -> tuple[PoolDecision, bool, PoolState]:
    """One pool's decision before the GPU budget; True when held fail-static; its next state."""
    pods, signals = pool.pods, pool.signals
    if signals is None:
        why = f"metrics missing ({pool.missing or 'no samples for this pool'})"
        return _hold(pods.active, pods.spares, why), True, state
    age = (now - signals.observed_at).total_seconds()
    if age > config.stale_after_s:
        why = f"metrics stale (newest sample {age:.0f} s old, limit {config.stale_after_s:.0f} s)"
        return _hold(pods.active, pods.spares, why), True, state
    bad = signals.invalid()
    if bad:
        return _hold(pods.active, pods.spares, f"metrics invalid ({bad})"), True, state

    predicted = forecast(state, signals.request_rate, signals.observed_at, config)
    correction = state.correction
    fresh = state.updated_at is None or signals.observed_at > state.updated_at
    # NOTE: learn once per new sample (the policy runs more often than Prometheus scrapes, and
    # one slow p95 must not cut the estimate again on every call), and not while pods start:
    # their latency has not caught up yet.
    evidence = _evidence(name, signals, spec, config)
    # NOTE: a pool the model itself finds short of replicas (its need at the current correction
    # above the ready pods: a step, a start from idle) misses its targets because it is small,
    # not because the model is wrong: learning there would cut the correction to its floor and
    # oversize the pool for the next ten minutes.
    short = (
        _need(
            name, pool, spec=spec, predicted=predicted, correction=correction, config=config
        ).replicas
        > pods.ready
    )
    if fresh and pods.starting == 0 and not short:
        elapsed = 0.0
        if state.updated_at is not None:
            elapsed = (signals.observed_at - state.updated_at).total_seconds()
        correction = learn(
            state.correction,
            evidence,
            elapsed_s=elapsed,
            floor=config.min_correction,
            recovery_s=config.correction_recovery_s,
        )
    need = _need(name, pool, spec=spec, predicted=predicted, correction=correction, config=config)

    lowest, remembered = floor(pool_spec, state, need.replicas, signals.observed_at, config)
    minimum = lowest.replicas
    maximum = pool_spec.max_replicas if pool_spec.max_replicas is not None else _MAX_REPLICAS
    target = min(max(need.replicas, minimum), maximum)
    why = f"needs {need.replicas} for {need.why}"
    if predicted.burst:
        why += (
            f"; burst: request rate {predicted.short_rate:.1f}/s short-term vs "
            f"{predicted.long_rate:.1f}/s long-term, forecast {predicted.rate:.1f}/s"
        )
    if evidence:
        why += f"; latency {', '.join(e.source for e in evidence)}"
    if need.replicas > maximum:
        why += f"; capped at maxReplicas {maximum}"
    elif need.replicas < minimum:
        why += f"; raised to {lowest.why}"

    decision, low_since, low_peak = _step(
        pods,
        target,
        why,
        burst=predicted.burst,
        state=state,
        now=now,
        window=spec.autoscaling.scale_down_stabilization_seconds,
    )
    if decision.active > maximum:
        # maxReplicas is a hard limit (it was lowered below what runs): no window to wait out.
        decision = replace(
            decision,
            active=maximum,
            reason=f"scale down {pods.active} -> {maximum} at once: above maxReplicas; {why}",
        )
    reason = decision.reason
    if pods.starting:
        reason += f"; {pods.starting} pods starting count as capacity to come"
    spares = spec.autoscaling.warm_spares
    if spares:
        reason += f"; {spares} warm spares"

    next_state = replace(
        remembered,
        updated_at=signals.observed_at,
        short_rate=predicted.short_rate,
        long_rate=predicted.long_rate,
        correction=correction,
        low_since=low_since,
        low_peak=low_peak,
    )
    misses = ttft_misses(name, signals, spec)
    decided = replace(decision, spares=spares, reason=reason, floor=minimum, ttft_misses=misses)
    return decided, False, next_state


def ttft_misses(name: str, signals: PoolSignals, spec: InferenceServiceSpec) -> SloMisses | None:
    """The window's requests over the TTFT target by cause: queued for capacity (more replicas
    fix them) or over it in their own prefill (they would miss on an idle engine), read as the
    correction reads them (`goodput.capacity_misses`, certain misses only); None for a pool
    without a TTFT target, a TTFT histogram or requests in the window."""
    target, histogram = spec.slo.ttft_p95_ms, signals.ttft_histogram
    if name not in _PREFILL_ROLES or target is None or histogram is None or histogram.total <= 0:
        return None
    late = capacity_misses(over(histogram, target / 1000.0, Round.UP), signals.prefill_histogram)
    return SloMisses(
        bound_ms=round(1000 * late.bound_s, 3),
        requests=round(late.total + late.prefill_bound, 1),
        capacity=round(late.over, 1),
        prompt_too_long=round(late.prefill_bound, 1),
    )


def _evidence(
    name: str, signals: PoolSignals, spec: InferenceServiceSpec, config: PolicyConfig
) -> list[Evidence]:
    """What the latency targets the pool answers for (TTFT for prefill, ITL for decode) say
    about the capacity model.

    Goodput first: the share of the window's requests over the target, against the share the
    SLO's percentile allows (`PolicyConfig.latency_quantile`), from the histogram's buckets
    (`goodput.py`): every request counts once, and a cut needs evidence beyond chance. Without
    a histogram (or with no request in the window) the observed p95 against the target, the
    steadier of the quantiles a minute gives (a minute's p99 is a handful of requests)."""
    result: list[Evidence] = []
    targets: list[
        tuple[float | None, LatencyHistogram | None, float | None, LatencyHistogram | None]
    ] = []
    if name in _PREFILL_ROLES:
        targets.append(
            (
                spec.slo.ttft_p95_ms,
                signals.ttft_histogram,
                signals.ttft_p95_ms,
                signals.prefill_histogram,
            )
        )
    if name in _DECODE_ROLES:
        targets.append((spec.slo.itl_p95_ms, signals.itl_histogram, signals.itl_p95_ms, None))
    allowed = 1.0 - config.latency_quantile
    for target, histogram, p95, own_time in targets:
        if target is None:
            continue
        if histogram is not None and histogram.total > 0:
            # Misses at the next bucket boundary, comfort at the previous one, and only misses
            # more replicas would remove (`goodput.py`).
            late = capacity_misses(over(histogram, target / 1000.0, Round.UP), own_time)
            cut = implied_ratio(wilson_lower(late, config.goodput_z), allowed)
            relaxed = capacity_misses(
                over(histogram, config.comfortable_latency * target / 1000.0, Round.DOWN),
                own_time,
            )
            comfortable = relaxed.bound_s > 0 and relaxed.share <= allowed
            source = (
                f"goodput {late.share:.1%} of {late.total:.0f} over {1000 * late.bound_s:g} ms "
                f"(allowed {allowed:.0%})"
            )
            if late.prefill_bound:
                source += f", {late.prefill_bound:.0f} prefill-bound left out"
            result.append(Evidence(cut, comfortable, source))
        elif p95 is not None and p95 > 0:
            comfortable = p95 <= config.comfortable_latency * target
            result.append(Evidence(target / p95, comfortable, f"p95 {p95:.0f} ms"))
    return result


def _need(
    name: str,
    pool: PoolInputs,
    *,
    spec: InferenceServiceSpec,
    predicted: Forecast,
    correction: float,
    config: PolicyConfig,
) -> Need:
    signals = pool.signals
    assert signals is not None
    # NOTE: next to no traffic makes the ratio meaningless (and a denormal rate makes it
    # infinite); and a forecast far beyond the current rate is the averages' lag, not a plan.
    growth = 1.0
    if signals.request_rate > _MIN_RATE:
        growth = min(predicted.rate / signals.request_rate, config.max_growth)
    gpu = spec.runtime.gpu
    capacity = (
        profiled_capacity(pool.profile, gpu.type, gpu.count)
        if pool.profile is not None
        else default_capacity(gpu.type, gpu.count)
    )
    needs: list[Need] = []
    if name in _PREFILL_ROLES:
        needs.append(
            prefill_need(
                signals,
                growth=growth,
                capacity=capacity,
                correction=correction,
                slo=spec.slo,
                config=config,
            )
        )
    if name in _DECODE_ROLES:
        needs.append(
            decode_need(
                signals,
                growth=growth,
                ready=pool.pods.ready,
                capacity=capacity,
                correction=correction,
                slo=spec.slo,
            )
        )
    return max(needs, key=lambda n: n.replicas)


def _step(
    pods: PoolPods,
    target: int,
    why: str,
    *,
    burst: bool,
    state: PoolState,
    now: datetime,
    window: int,
) -> tuple[PoolDecision, datetime | None, int]:
    """Up at once; down after the window to the peak need over it. Returns the decision (no
    spares yet) and the new scale-down bookkeeping (low_since, low_peak)."""
    current = pods.active
    if target > current and pods.unschedulable > 0:
        limited = (
            f"{pods.unschedulable} pods Pending unschedulable; not adding more until they are "
            f"placed (needs {target})"
        )
        return PoolDecision(current, 0, f"holding {current}: {limited}; {why}", limited), None, 0
    if target > current:
        return PoolDecision(target, 0, f"scale up {current} -> {target}: {why}"), None, 0
    if target == current:
        return PoolDecision(current, 0, f"steady at {current}: {why}"), None, 0
    low_since = state.low_since or now
    low_peak = max(state.low_peak if state.low_since else 0, target)
    waited = (now - low_since).total_seconds()
    if burst:
        # NOTE: a burst the pool is already big enough for holds the scale-down but does not
        # restart its window (a trace with a burst every few minutes would otherwise keep a
        # pool sized for an old peak for as long as the bursts go on); its need joins the peak
        # the window will scale down to.
        reason = f"holding {current} during a burst (load fits in {target}): {why}"
        return PoolDecision(current, 0, reason), low_since, low_peak
    if waited >= window:
        reason = (
            f"scale down {current} -> {low_peak}: load fits in fewer for {waited:.0f} s "
            f"(window {window} s); {why}"
        )
        return PoolDecision(low_peak, 0, reason), None, 0
    reason = (
        f"holding {current}: load fits in {target} for {waited:.0f} s of the {window} s "
        f"scale-down stabilization window; {why}"
    )
    return PoolDecision(current, 0, reason), low_since, low_peak


def _cut(plan: PoolDecision, wish: Wish, cut: str) -> PoolDecision:
    """`plan` sized down to what the GPU budget let it have, `cut` saying why."""
    return replace(
        plan,
        active=wish.active,
        spares=wish.spares,
        reason=f"{plan.reason}; {cut}",
        limited="; ".join(x for x in (plan.limited, cut) if x),
    )


def _hold(active: int, spares: int, why: str) -> PoolDecision:
    return PoolDecision(active, spares, f"holding {active} active, {spares} spares: {why}")
