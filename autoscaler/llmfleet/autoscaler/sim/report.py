"""What `llmfleet sim` shows: one table per trace, the same as JSON, and PNG timelines."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from rich.table import Table

from llmfleet.autoscaler.sim.compare import GOAL, Comparison, PolicyMetrics, is_ours
from llmfleet.autoscaler.sim.run import SimSettings


def _ms(value: float) -> str:
    if not math.isfinite(value):
        return "inf"
    return f"{value / 1000:.2f} s" if value >= 10_000 else f"{value:.0f} ms"


def title(comparison: Comparison) -> str:
    slo = comparison.settings.slo
    trace = comparison.trace
    model = comparison.settings.model
    return (
        f"{trace.name}: {len(trace.requests)} requests over {trace.duration / 60:.0f} min, "
        f"mean prompt {trace.mean_prompt_tokens:.0f} / output {trace.mean_output_tokens:.0f} "
        f"tokens. SLO: TTFT <= {slo.ttft_ms:g} ms, ITL (TPOT) <= {slo.itl_ms:g} ms, goal "
        f">= {GOAL:g}% of requests. Engine: 8B BF16 on H100, {model.max_batched_tokens} batched "
        f"tokens, {model.max_num_seqs} seqs, cold start {model.cold_start_s:g} s, spare "
        f"promotion {model.promote_s:g} s. Routing: {_routing(comparison.settings)}. "
        f"Static peak = {comparison.static_replicas} replicas; "
        f"{_step(comparison)}{_prefix(comparison)}{_out_of_reach(comparison)}"
    )


def _routing(settings: SimSettings) -> str:
    """The routing profile, and the gateway's scraped figures and replicas where not ideal."""
    said = settings.routing
    if settings.scrape_s == math.inf:
        said += ", no scraped figures (in-flight counts only)"
    elif settings.scrape_s > 0:
        said += f", scraped figures refreshed every {settings.scrape_s:g} s"
    if settings.gateway_replicas > 1:
        said += f", {settings.gateway_replicas} gateway replicas"
    return said


def _out_of_reach(comparison: Comparison) -> str:
    """The share of requests no fleet can serve within the TTFT target: their prompt alone
    takes longer to prefill on an idle engine (a prefix-cache hit aside)."""
    model, target_s = comparison.settings.model, comparison.settings.slo.ttft_ms / 1000
    requests = comparison.trace.requests
    slow = sum(1 for r in requests if model.lone_ttft_s(r.prompt_tokens) > target_s)
    if not slow:
        return ""
    return (
        f" {slow / len(requests):.2%} of requests take longer than the TTFT target on an idle "
        f"engine: no fleet serves them in time."
    )


def _step(comparison: Comparison) -> str:
    step = comparison.step
    if step is None:
        return "no load step (to capacity: -)."
    return (
        f"largest load step at {step.start:.0f} s: {step.before} -> {step.need} replicas "
        f"(to capacity: until {step.need} serve)."
    )


def _prefix(comparison: Comparison) -> str:
    if not any(r.blocks for r in comparison.trace.requests):
        return ""
    return (
        f" Prefix hit: share of prompt tokens from the cache; an infinite shared cache would "
        f"serve {comparison.prefix_upper_bound:.1%}."
    )


def table(comparison: Comparison) -> Table:
    result = Table(title=title(comparison), title_justify="left")
    for column in (
        "policy",
        "TTFT ok %",
        "ITL ok %",
        "GPU-h",
        "TTFT p95",
        "TTFT p99",
        "ITL p95",
        "ITL p99",
        "scale ev",
        "to capacity",
        "prefix hit",
        "meets",
    ):
        result.add_column(column, justify="left" if column == "policy" else "right")
    for m in comparison.metrics:
        result.add_row(
            m.policy,
            f"{m.ttft_attainment:.2f}",
            f"{m.itl_attainment:.2f}",
            f"{m.gpu_hours:.2f}",
            _ms(m.ttft_p95_ms),
            _ms(m.ttft_p99_ms),
            _ms(m.itl_p95_ms),
            _ms(m.itl_p99_ms),
            str(m.scale_events),
            "-" if m.time_to_capacity_s is None else f"{m.time_to_capacity_s:.0f} s",
            f"{m.prefix_hit_share:.1%}",
            "yes" if m.meets_goal else "no",
        )
    return result


def verdict(comparison: Comparison) -> str:
    """Whether ours meets the goal at fewer GPU-hours than every baseline that meets it."""
    ours = next((m for m in comparison.metrics if m.policy == "llmfleet"), None)
    if ours is None:
        return "llmfleet not run"
    rivals = [m for m in comparison.metrics if not is_ours(m.policy) and m.meets_goal]
    if not ours.meets_goal:
        return (
            f"goal NOT met: llmfleet reaches {ours.ttft_attainment:.2f}% TTFT / "
            f"{ours.itl_attainment:.2f}% ITL"
        )
    if not rivals:
        return f"goal met: llmfleet meets the SLO at {ours.gpu_hours:.2f} GPU-h; no baseline does"
    best = min(rivals, key=lambda m: m.gpu_hours)
    if ours.gpu_hours < best.gpu_hours:
        saving = 100.0 * (1 - ours.gpu_hours / best.gpu_hours)
        return (
            f"goal met: llmfleet {ours.gpu_hours:.2f} GPU-h vs {best.policy} "
            f"{best.gpu_hours:.2f} GPU-h, the cheapest baseline meeting the SLO "
            f"({saving:.0f}% fewer)"
        )
    return (
        f"goal NOT met: llmfleet {ours.gpu_hours:.2f} GPU-h is not below {best.policy} "
        f"{best.gpu_hours:.2f} GPU-h"
    )


def _cheapest_rival(comparison: Comparison) -> PolicyMetrics | None:
    rivals = [m for m in comparison.metrics if not is_ours(m.policy) and m.meets_goal]
    return min(rivals, key=lambda m: m.gpu_hours) if rivals else None


def _beside(comparison: Comparison) -> PolicyMetrics | None:
    """Our policy's second run (`Options.beside_spares`), if there was one."""
    return next((m for m in comparison.metrics if m.policy.startswith("llmfleet ")), None)


def summary(comparisons: list[Comparison]) -> Table:
    """One row per trace: ours against the cheapest baseline that meets the goal."""
    result = Table(title="Summary: llmfleet against the cheapest baseline meeting the goal")
    beside = next((b.policy for c in comparisons if (b := _beside(c)) is not None), None)
    columns = ["trace", "llmfleet TTFT / ITL ok %", "GPU-h"]
    if beside is not None:
        columns += [f"{beside} TTFT / ITL ok %", "GPU-h "]
    for column in (*columns, "cheapest baseline at goal", "goal"):
        result.add_column(column, justify="left" if column in ("trace", "goal") else "right")

    def cells(m: PolicyMetrics | None) -> list[str]:
        if m is None:
            return ["-", "-"]
        return [f"{m.ttft_attainment:.2f} / {m.itl_attainment:.2f}", f"{m.gpu_hours:.2f}"]

    for comparison in comparisons:
        ours = next((m for m in comparison.metrics if m.policy == "llmfleet"), None)
        rival = _cheapest_rival(comparison)
        row = [comparison.trace.name, *cells(ours)]
        if beside is not None:
            row += cells(_beside(comparison))
        result.add_row(
            *row,
            "none" if rival is None else f"{rival.policy} {rival.gpu_hours:.2f}",
            verdict(comparison).split(":")[0],
        )
    return result


def summary_json(comparisons: list[Comparison]) -> list[dict[str, Any]]:
    rows = []
    for comparison in comparisons:
        ours = next((m for m in comparison.metrics if m.policy == "llmfleet"), None)
        rival = _cheapest_rival(comparison)
        rows.append(
            {
                "trace": comparison.trace.name,
                "llmfleet": None if ours is None else _row(ours),
                "llmfleetBeside": None if (b := _beside(comparison)) is None else _row(b),
                "cheapestBaselineAtGoal": None if rival is None else rival.policy,
                "verdict": verdict(comparison),
            }
        )
    return rows


def _number(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, 4)


def _row(m: PolicyMetrics) -> dict[str, Any]:
    return {
        "policy": m.policy,
        "ttftAttainmentPct": _number(m.ttft_attainment),
        "itlAttainmentPct": _number(m.itl_attainment),
        "gpuHours": _number(m.gpu_hours),
        "ttftP50Ms": _number(m.ttft_p50_ms),
        "ttftP95Ms": _number(m.ttft_p95_ms),
        "ttftP99Ms": _number(m.ttft_p99_ms),
        "itlP95Ms": _number(m.itl_p95_ms),
        "itlP99Ms": _number(m.itl_p99_ms),
        "scaleEvents": m.scale_events,
        "timeToCapacityS": _number(m.time_to_capacity_s),
        "preemptions": m.preemptions,
        "prefixHitShare": _number(m.prefix_hit_share),
        "meetsGoal": m.meets_goal,
        "wallSeconds": _number(m.wall_s),
    }


def as_json(comparison: Comparison) -> dict[str, Any]:
    trace, settings = comparison.trace, comparison.settings
    return {
        "trace": trace.name,
        "kind": trace.kind,
        "requests": len(trace.requests),
        "durationS": round(trace.duration, 3),
        "slo": {"ttftMs": settings.slo.ttft_ms, "itlMs": settings.slo.itl_ms, "goalPct": GOAL},
        "routing": settings.routing,
        "scrapeSeconds": _number(settings.scrape_s),  # null: never scraped
        "gatewayReplicas": settings.gateway_replicas,
        "engine": {
            "maxBatchedTokens": settings.model.max_batched_tokens,
            "maxNumSeqs": settings.model.max_num_seqs,
            "kvTokens": settings.model.kv_tokens,
            "coldStartS": settings.model.cold_start_s,
            "promoteS": settings.model.promote_s,
        },
        "staticReplicas": comparison.static_replicas,
        "initialReplicas": comparison.initial_replicas,
        "loadStep": None
        if comparison.step is None
        else {
            "startS": comparison.step.start,
            "need": comparison.step.need,
            "before": comparison.step.before,
        },
        "prefixHitUpperBound": round(comparison.prefix_upper_bound, 4),
        "policies": [_row(m) for m in comparison.metrics],
        "verdict": verdict(comparison),
    }


def plot(comparison: Comparison, directory: Path) -> list[Path]:
    """load.png-style timelines for one trace: load, replicas, TTFT p95 and ITL p95 per policy."""
    directory.mkdir(parents=True, exist_ok=True)
    stem = re.sub(r"[^\w.-]+", "_", comparison.trace.name)
    for suffix in (".csv", ".jsonl"):
        stem = stem.replace(suffix, "")
    slo = comparison.settings.slo
    figure = Figure(figsize=(12, 13))
    axes = figure.subplots(4, 1, sharex=True)
    load_axis, pods_axis, ttft_axis, itl_axis = axes
    first = comparison.runs[0].timeline if comparison.runs else []
    load_axis.plot(
        [p.t / 60 for p in first], [p.arrival_rate for p in first], color="black", label="req/s"
    )
    load_axis.set_ylabel("requests/s (1 min)")
    twin = load_axis.twinx()
    twin.plot(
        [p.t / 60 for p in first],
        [p.prompt_tokens_rate / 1000 for p in first],
        color="grey",
        linestyle=":",
    )
    twin.set_ylabel("prompt k-tok/s prefilled")
    for run in comparison.runs:
        ts = [p.t / 60 for p in run.timeline]
        pods_axis.step(ts, [p.pods for p in run.timeline], where="post", label=run.policy)
        ttft_axis.plot(ts, [p.ttft_p95_ms or math.nan for p in run.timeline], label=run.policy)
        itl_axis.plot(ts, [p.itl_p95_ms or math.nan for p in run.timeline], label=run.policy)
    pods_axis.set_ylabel("pods (GPUs held)")
    ttft_axis.set_ylabel("TTFT p95 (1 min), ms")
    ttft_axis.set_yscale("log")
    ttft_axis.axhline(slo.ttft_ms, color="red", linestyle="--", linewidth=1)
    itl_axis.set_ylabel("ITL p95 (1 min), ms")
    itl_axis.axhline(slo.itl_ms, color="red", linestyle="--", linewidth=1)
    itl_axis.set_xlabel("minutes")
    pods_axis.legend(loc="upper right", fontsize="small", ncol=3)
    figure.suptitle(f"{comparison.trace.name}: load, replicas and latency")
    figure.tight_layout()
    path = directory / f"{stem}.png"
    figure.savefig(path, dpi=90)
    return [path]
