"""All policies on one trace: the shared engine and SLO, each run, and the figures a row shows.

- TTFT attainment: share of requests whose TTFT is within the target; ITL attainment: share
  whose mean gap between tokens (TPOT, DistServe's per-request measure) is within the ITL
  target. A request that never finishes misses both.
- p95/p99 TTFT over requests; p95/p99 ITL over all generated tokens (each step's gap counted
  once per token that waited for it).
- GPU-hours: every pod (starting, spare, serving, draining) from the start to the last arrival.
- Scale events: changes of the serving-replica target.
- To capacity: from the trace's largest load step to the serving capacity it needs (`steps`).
- Prefix hit share: prompt tokens served from the prefix cache, next to the trace's upper bound
  (`traces.prefix_upper_bound`: the share an infinite cache shared by every pod would serve).
- Percentiles take the nearest sample at or above the rank (no interpolation): a request that
  never got a first token is inf, and interpolating towards it is no latency.

Static peak is the smallest fixed fleet that reaches the attainment goal over the whole trace,
found by replaying it (starting from the sizing of the busiest minute): the most generous static
baseline, an oracle no team without the trace could size.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from llmfleet.autoscaler.inputs import PolicyConfig
from llmfleet.autoscaler.sim import POLICIES
from llmfleet.autoscaler.sim.baselines import (
    AibrixKpa,
    DynamoPlanner,
    DynamoProfile,
    KedaInflight,
    StaticPeak,
)
from llmfleet.autoscaler.sim.controller import Controller
from llmfleet.autoscaler.sim.observe import weighted_quantile
from llmfleet.autoscaler.sim.ours import OurPolicy, service_spec
from llmfleet.autoscaler.sim.profile import engine_profile, replicas_for, windows
from llmfleet.autoscaler.sim.run import RunResult, SimSettings, simulate
from llmfleet.autoscaler.sim.steps import Step, largest_step, time_to_capacity
from llmfleet.autoscaler.sim.traces import Trace, prefix_upper_bound
from llmfleet.autoscaler.sim.wva import LlmdWva
from llmfleet.core.errors import UserError
from llmfleet.crds.spec import SloSpec

GOAL = 99.0
"""Attainment (%) a policy must reach for both TTFT and ITL to count as meeting the SLO."""
BASELINE_MIN_REPLICAS = 2
"""The baselines' minReplicas when `Options.min_replicas` is None: two serving pods, what a
production service sets for availability (KEDA's `minReplicaCount`, an HPA's `minReplicas`)."""


@dataclass(frozen=True)
class Options:
    warm_spares: int = 1
    min_replicas: int | None = 1
    """Every autoscaling policy's floor (the static baseline has its own count). None: our
    policy's minReplicas is left unset (it chooses its floor, `floor.py`), the baselines get
    `BASELINE_MIN_REPLICAS`, what their users set for availability."""
    max_replicas: int = 64
    beside_spares: int | None = None
    """Our policy once more with this many warm spares (named by `ours_beside`), reported beside
    it; None or `warm_spares`: not run (the robust suite sets the other of 0 and 1)."""


def ours_beside(spares: int) -> str:
    """The name our policy's second run (`Options.beside_spares`) is reported under."""
    return f"llmfleet {spares} spare{'' if spares == 1 else 's'}"


def is_ours(policy: str) -> bool:
    """Our policy or its second run: never a baseline to compare against."""
    return policy == "llmfleet" or policy.startswith("llmfleet ")


@dataclass(frozen=True)
class PolicyMetrics:
    policy: str
    ttft_attainment: float
    itl_attainment: float
    gpu_hours: float
    ttft_p50_ms: float
    ttft_p95_ms: float
    ttft_p99_ms: float
    itl_p95_ms: float
    itl_p99_ms: float
    scale_events: int
    time_to_capacity_s: float | None
    preemptions: int
    prefix_hit_share: float
    wall_s: float

    @property
    def meets_goal(self) -> bool:
        return self.ttft_attainment >= GOAL and self.itl_attainment >= GOAL


@dataclass
class Comparison:
    trace: Trace
    settings: SimSettings
    static_replicas: int
    initial_replicas: int
    step: Step | None
    """The largest load step, or None when the trace has none."""
    prefix_upper_bound: float
    metrics: list[PolicyMetrics]
    runs: list[RunResult]


def check_policies(names: Sequence[str]) -> list[str]:
    unknown = [n for n in names if n not in POLICIES]
    if unknown:
        raise UserError(
            f"unknown policy {', '.join(repr(n) for n in unknown)} (known: {', '.join(POLICIES)})"
        )
    return list(dict.fromkeys(names))


def check_slo(trace: Trace, settings: SimSettings) -> None:
    """An SLO no engine can meet is a mistake in the command, not a result."""
    slo = settings.slo
    if not (math.isfinite(slo.ttft_ms) and slo.ttft_ms > 0):
        raise UserError(f"impossible SLO: TTFT target must be > 0 ms, got {slo.ttft_ms:g}")
    if not (math.isfinite(slo.itl_ms) and slo.itl_ms > 0):
        raise UserError(f"impossible SLO: ITL target must be > 0 ms, got {slo.itl_ms:g}")
    model = settings.model
    mean_prompt = round(trace.mean_prompt_tokens)
    lone = 1000 * model.lone_ttft_s(mean_prompt)
    if slo.ttft_ms < lone:
        raise UserError(
            f"impossible SLO: TTFT {slo.ttft_ms:g} ms is below what an idle engine needs for "
            f"the trace's mean prompt ({mean_prompt} tokens: {lone:.0f} ms)"
        )
    step = 1000 * model.decode_step_s(1, mean_prompt)
    if slo.itl_ms < step:
        raise UserError(
            f"impossible SLO: ITL {slo.itl_ms:g} ms is below one decode step of an idle engine "
            f"({step:.1f} ms)"
        )


def _percentile(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q, method="higher"))


def metrics(run: RunResult, settings: SimSettings, step: Step | None) -> PolicyMetrics:
    slo = settings.slo
    ttft, tpot = run.ttft_s, run.tpot_s
    itl_p95 = itl_p99 = math.nan
    if run.itl_values.size:
        itl_p95 = 1000 * weighted_quantile(run.itl_values, run.itl_weights, 0.95)
        itl_p99 = 1000 * weighted_quantile(run.itl_values, run.itl_weights, 0.99)
    return PolicyMetrics(
        policy=run.policy,
        ttft_attainment=100.0 * float(np.mean(ttft <= slo.ttft_ms / 1000)),
        itl_attainment=100.0 * float(np.mean(tpot <= slo.itl_ms / 1000)),
        gpu_hours=run.gpu_hours,
        ttft_p50_ms=1000 * _percentile(ttft, 50),
        ttft_p95_ms=1000 * _percentile(ttft, 95),
        ttft_p99_ms=1000 * _percentile(ttft, 99),
        itl_p95_ms=itl_p95,
        itl_p99_ms=itl_p99,
        scale_events=run.scale_events,
        time_to_capacity_s=None if step is None else time_to_capacity(run.serving_log, step),
        preemptions=run.preemptions,
        prefix_hit_share=run.prefix_hit_share,
        wall_s=run.wall_s,
    )


def compare(
    trace: Trace,
    settings: SimSettings,
    options: Options,
    policies: Sequence[str] = POLICIES,
    progress: Callable[[str], None] = lambda _: None,
) -> Comparison:
    check_slo(trace, settings)
    names = check_policies(policies)
    profile = engine_profile(settings.model)
    slo = SloSpec(ttft_p95_ms=settings.slo.ttft_ms, itl_p95_ms=settings.slo.itl_ms)
    loads = windows(trace, 60.0, settings.tick_s)

    def need(rate: float, prompt: float, output: float) -> int:
        if rate <= 0:
            return 1
        return min(
            replicas_for(rate, prompt, output, profile=profile, slo=slo), options.max_replicas
        )

    needs = [need(r, p, o) for _, r, p, o in loads]
    floor = options.min_replicas if options.min_replicas is not None else BASELINE_MIN_REPLICAS
    initial = max(needs[0], floor)
    step = largest_step([start for start, _, _, _ in loads], needs, settings.tick_s)
    static = (
        _static_replicas(trace, settings, max(needs), options.max_replicas, progress)
        if "static-peak" in names
        else max(needs)
    )
    itl_ms, ttft_ms = settings.slo.itl_ms, settings.slo.ttft_ms
    cap = options.max_replicas

    def ours(spares: int, name: str) -> OurPolicy:
        return OurPolicy(
            service_spec(
                ttft_ms=ttft_ms,
                itl_ms=itl_ms,
                initial=initial,
                min_replicas=options.min_replicas,
                max_replicas=cap,
                warm_spares=spares,
            ),
            profile,
            # A goal of 99% of requests within the targets makes them 99th-percentile targets;
            # a forecast is worth as far ahead as a new pod takes to serve.
            PolicyConfig(latency_quantile=GOAL / 100, horizon_s=settings.model.cold_start_s),
            name=name,
        )

    factories: dict[str, Callable[[], Controller]] = {
        "llmfleet": lambda: ours(options.warm_spares, "llmfleet"),
        "static-peak": lambda: StaticPeak(static),
        "keda-inflight": lambda: KedaInflight(initial, min_replicas=floor, max_replicas=cap),
        "llm-d-wva": lambda: LlmdWva(initial, settings.model, min_replicas=floor, max_replicas=cap),
        "dynamo-planner": lambda: DynamoPlanner(
            initial,
            DynamoProfile(settings.model),
            itl_ms=itl_ms,
            min_replicas=floor,
            max_replicas=cap,
        ),
        "aibrix-kpa": lambda: AibrixKpa(initial, min_replicas=floor, max_replicas=cap),
    }
    beside = options.beside_spares
    if "llmfleet" in names and beside is not None and beside != options.warm_spares:
        factories[ours_beside(beside)] = lambda: ours(beside, ours_beside(beside))
        names = [*names, ours_beside(beside)]
    runs: list[RunResult] = []
    for name in names:
        run = simulate(trace, factories[name](), settings)
        runs.append(run)
        progress(f"{trace.name}: {name} done in {run.wall_s:.1f} s")
    return Comparison(
        trace=trace,
        settings=settings,
        static_replicas=static,
        initial_replicas=initial,
        step=step,
        prefix_upper_bound=prefix_upper_bound(trace),
        metrics=[metrics(run, settings, step) for run in runs],
        runs=runs,
    )


def _static_replicas(
    trace: Trace,
    settings: SimSettings,
    estimate: int,
    maximum: int,
    progress: Callable[[str], None],
) -> int:
    """The smallest fixed fleet meeting the goal (or `maximum`), searched from `estimate`."""
    cache: dict[int, bool] = {}

    def meets(n: int) -> bool:
        if n not in cache:
            run = simulate(trace, StaticPeak(n), settings)
            slo = settings.slo
            cache[n] = (
                100.0 * float(np.mean(run.ttft_s <= slo.ttft_ms / 1000)) >= GOAL
                and 100.0 * float(np.mean(run.tpot_s <= slo.itl_ms / 1000)) >= GOAL
            )
            progress(f"{trace.name}: static {n} replicas {'meets' if cache[n] else 'misses'}")
        return cache[n]

    n = max(1, min(estimate, maximum))
    if meets(n):
        while n > 1 and meets(n - 1):
            n -= 1
        return n
    low, high = n, n
    while not meets(high):
        if high >= maximum:
            return maximum
        low, high = high, min(high * 2, maximum)
    while high - low > 1:
        mid = (low + high) // 2
        if meets(mid):
            high = mid
        else:
            low = mid
    return high
