"""Canary analysis (pure): the PromQL that compares a canary with the stable revision over the
same window, and the verdict on its figures.

Label contract. The engines' series carry `namespace`, `llmfleet_dev_service` and `revision`
(the pod's `llmfleet.dev/revision`: the ServiceMonitor relabels it, the local cluster's file
discovery sets it); the gateway's own series carry `namespace`, `service` and `revision` (the
revision that served the request). The canary is `revision="<canary>"`; the stable side is
every other series of the service (`revision!="<canary>"`), so pods or requests from before
the revision label existed count as stable.

Figures per side, all over the last `window` (the analysis interval), in one query:
- `requests`: requests the gateway sent to the side and got an answer or an error for
  (`increase()` of `llmfleet_gateway_requests_total` with outcome ok, client_error,
  upstream_error, stream_error, timeout or unavailable; not the gateway's own refusals, 429s
  or clients that left);
- `errors`: those that failed because of the engines (upstream_error, stream_error, timeout,
  unavailable: a 5xx after the retry, a broken stream, no answer in time);
- `ttft_p95_ms`, `itl_p95_ms`: the side's summed bucket rates (`sum by (le)`) of the engines'
  `vllm:time_to_first_token_seconds` and `vllm:inter_token_latency_seconds` (or
  `vllm:time_per_output_token_seconds`, vLLM's older name); the 95th percentile is interpolated
  here as PromQL's `histogram_quantile` does, and the bucket it falls in is kept: within one
  bucket the interpolation assumes an even spread, so two p95s in the same bucket are no
  evidence that one side is slower (`judge`'s ratio check asks for the canary's p95 in a higher
  bucket). The engines measure every request, streamed or not.

Each expression is tagged with `llmfleet_track` (canary, stable) and `llmfleet_figure` by
`label_replace` and `or` joins them, so one `/api/v1/query` answers everything at one instant.
The window must span at least two scrapes (four to survive a missed one).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from llmfleet.crds import InferenceServiceSpec
from llmfleet.operator.rollout import Analysis, Verdict

TRACK_LABEL = "llmfleet_track"
FIGURE_LABEL = "llmfleet_figure"
ENGINE_SERVICE_LABEL = "llmfleet_dev_service"
"""`llmfleet.dev/service` as Prometheus spells the engines' pod target label."""
REVISION_LABEL = "revision"
GATEWAY_REQUESTS = "llmfleet_gateway_requests_total"
SERVED_OUTCOMES = ("ok", "client_error", "upstream_error", "stream_error", "timeout", "unavailable")
ERROR_OUTCOMES = ("upstream_error", "stream_error", "timeout", "unavailable")
QUANTILE = 0.95
"""The SLO targets and the analysis limits are 95th percentiles."""


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def queries(namespace: str, service: str, canary: str, window_seconds: int) -> dict[str, str]:
    """`<track>/<figure>` -> PromQL, for both tracks (pure)."""
    window = f"{window_seconds}s"
    found: dict[str, str] = {}
    for track, op in (("canary", "="), ("stable", "!=")):
        revision = f"{REVISION_LABEL}{op}{_quote(canary)}"
        engines = (
            f"namespace={_quote(namespace)},{ENGINE_SERVICE_LABEL}={_quote(service)},{revision}"
        )
        gateway = f"namespace={_quote(namespace)},service={_quote(service)},{revision}"

        def count(outcomes: Sequence[str], match: str = gateway) -> str:
            selector = f'{match},outcome=~"{"|".join(outcomes)}"'
            return f"sum(increase({GATEWAY_REQUESTS}{{{selector}}}[{window}]))"

        def buckets(histogram: str, match: str = engines) -> str:
            return f"sum by (le) (rate({histogram}_bucket{{{match}}}[{window}]))"

        found[f"{track}/requests"] = count(SERVED_OUTCOMES)
        found[f"{track}/errors"] = count(ERROR_OUTCOMES)
        found[f"{track}/ttft_p95_ms"] = buckets("vllm:time_to_first_token_seconds")
        found[f"{track}/itl_p95_ms"] = (
            f"({buckets('vllm:inter_token_latency_seconds')}"
            f" or {buckets('vllm:time_per_output_token_seconds')})"
        )
    return found


def combined_query(found: Mapping[str, str]) -> str:
    """Every figure of both tracks in one expression, each tagged with its track and figure."""
    parts = []
    for key, query in found.items():
        track, figure = key.split("/")
        tagged = f'label_replace({query}, "{TRACK_LABEL}", "{track}", "", "")'
        parts.append(f'label_replace({tagged}, "{FIGURE_LABEL}", "{figure}", "", "")')
    return "\nor\n".join(parts)


@dataclass(frozen=True)
class Figures:
    """One side of the comparison over the window; None where nothing was measured."""

    requests: float = 0.0
    errors: float = 0.0
    ttft_p95_ms: float | None = None
    itl_p95_ms: float | None = None
    ttft_bucket_ms: tuple[float, float] | None = None
    """The histogram bucket (lower, upper bound) the TTFT p95 lies in."""
    itl_bucket_ms: tuple[float, float] | None = None
    """The histogram bucket (lower, upper bound) the ITL p95 lies in."""

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


def quantile(q: float, buckets: Sequence[tuple[float, float]]) -> tuple[float, float, float] | None:
    """The q-quantile of a histogram's cumulative `(upper bound, count)` buckets, interpolated
    as PromQL's `histogram_quantile` does, with the bounds of the bucket it lies in; None without
    observations (or without the `+Inf` bucket). A quantile in the `+Inf` bucket is the highest
    finite bound (Prometheus' answer too)."""
    ordered = sorted(buckets)
    if len(ordered) < 2 or not math.isinf(ordered[-1][0]):
        return None
    cumulative, highest = [], 0.0
    for bound, count in ordered:  # rates of counters: a dip is noise, as in Prometheus
        highest = max(highest, count)
        cumulative.append((bound, highest))
    total = cumulative[-1][1]
    if total <= 0:
        return None
    rank = q * total
    index = next(i for i, (_, count) in enumerate(cumulative) if count >= rank)
    if index == len(cumulative) - 1:
        top = cumulative[-2][0]
        return top, top, top
    upper, count = cumulative[index]
    lower, below = cumulative[index - 1] if index > 0 else (0.0, 0.0)
    if index == 0 and upper <= 0:
        return upper, upper, upper
    inside = count - below
    value = lower + (upper - lower) * (rank - below) / inside if inside > 0 else upper
    return value, lower, upper


def parse(result: Sequence[Mapping[str, Any]]) -> dict[str, Figures]:
    """Figures per track (`canary`, `stable`) from the combined query's vector (pure): a count
    without series is 0, a quantile over no samples None."""
    values: dict[str, dict[str, float]] = {"canary": {}, "stable": {}}
    histograms: dict[str, dict[str, list[tuple[float, float]]]] = {"canary": {}, "stable": {}}
    for sample in result:
        labels = sample["metric"]
        value = float(sample["value"][1])
        track, figure = labels[TRACK_LABEL], labels[FIGURE_LABEL]
        if "le" in labels:
            if not math.isnan(value):
                histograms[track].setdefault(figure, []).append((float(labels["le"]), value))
        elif not math.isnan(value):
            values[track][figure] = value
    figures = {}
    for track, found in values.items():
        p95: dict[str, tuple[float, tuple[float, float]]] = {}
        for figure, buckets in histograms[track].items():
            answer = quantile(QUANTILE, buckets)
            if answer is not None:
                value, lower, upper = (seconds * 1000 for seconds in answer)
                p95[figure] = (value, (lower, upper))
        ttft, itl = p95.get("ttft_p95_ms"), p95.get("itl_p95_ms")
        figures[track] = Figures(
            requests=found.get("requests", 0.0),
            errors=found.get("errors", 0.0),
            ttft_p95_ms=ttft[0] if ttft else None,
            itl_p95_ms=itl[0] if itl else None,
            ttft_bucket_ms=ttft[1] if ttft else None,
            itl_bucket_ms=itl[1] if itl else None,
        )
    return figures


@dataclass(frozen=True)
class Limit:
    value: float | None
    source: str
    """Where the value comes from, e.g. `spec.slo.itlP95Ms`."""


@dataclass(frozen=True)
class Limits:
    ttft_p95_ms: Limit = field(default_factory=lambda: Limit(None, ""))
    itl_p95_ms: Limit = field(default_factory=lambda: Limit(None, ""))
    max_error_rate: float = 0.01
    max_latency_ratio: float = 1.5
    min_requests: int = 50
    window_seconds: int = 60


def limits_for(spec: InferenceServiceSpec) -> Limits:
    """The analysis' limits: `rollout.analysis`, with the latency limits falling back to the
    service's SLO (and no absolute limit where neither says one)."""
    analysis, slo = spec.rollout.analysis, spec.slo

    def limit(own: float | None, name: str, slo_value: float | None, slo_name: str) -> Limit:
        if own is not None:
            return Limit(own, f"spec.rollout.analysis.{name}")
        return Limit(slo_value, f"spec.slo.{slo_name}" if slo_value is not None else "")

    return Limits(
        ttft_p95_ms=limit(analysis.max_ttft_p95_ms, "maxTtftP95Ms", slo.ttft_p95_ms, "ttftP95Ms"),
        itl_p95_ms=limit(analysis.max_itl_p95_ms, "maxItlP95Ms", slo.itl_p95_ms, "itlP95Ms"),
        max_error_rate=analysis.max_error_rate,
        max_latency_ratio=analysis.max_latency_ratio,
        min_requests=analysis.min_requests,
        window_seconds=analysis.interval_seconds,
    )


def _ms(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.1f} ms" if value < 100 else f"{value:.0f} ms"


def _side(figures: Figures) -> str:
    return (f"{figures.requests:.0f} requests, {figures.errors:.0f} errors "
            f"({figures.error_rate:.1%}), TTFT p95 {_ms(figures.ttft_p95_ms)}, "
            f"ITL p95 {_ms(figures.itl_p95_ms)}")  # fmt: skip


def judge(canary: Figures, stable: Figures, limits: Limits) -> Analysis:
    """The verdict on one window (pure). Too few canary requests, or no latency measured for
    it, is `WaitForSamples`; then the error rate, the absolute latency limits and the latency
    relative to stable (once stable has `min_requests` too) are checked in that order, the
    first that fails naming its figure, the limit and the stable revision's figure."""
    window = limits.window_seconds
    summary = f"last {window}s: canary {_side(canary)}; stable {_side(stable)}"
    if canary.requests < limits.min_requests:
        needed = (f"the canary served {canary.requests:.0f} of the {limits.min_requests} "
                  f"requests a verdict needs in the last {window}s")  # fmt: skip
        return Analysis(Verdict.WAIT, f"{needed} ({summary})")
    for name, value in (("TTFT", canary.ttft_p95_ms), ("ITL", canary.itl_p95_ms)):
        if value is None:
            missing = f"no {name} measured by the canary's engines in the last {window}s"
            return Analysis(Verdict.WAIT, f"{missing} ({summary})")
    failed = _failed_check(canary, stable, limits)
    if failed:
        return Analysis(Verdict.FAIL, summary, failed)
    compared = stable.requests >= limits.min_requests
    note = "" if compared else " (stable: too few requests to compare latency with)"
    return Analysis(Verdict.PASS, summary + note)


def _failed_check(canary: Figures, stable: Figures, limits: Limits) -> str:
    if canary.error_rate > limits.max_error_rate:
        return (f"error rate of the canary {canary.error_rate:.1%} ({canary.errors:.0f} of "
                f"{canary.requests:.0f}) exceeds {limits.max_error_rate:.1%} "
                f"(spec.rollout.analysis.maxErrorRate; stable: {stable.error_rate:.1%}, "
                f"{stable.errors:.0f} of {stable.requests:.0f})")  # fmt: skip
    latencies = (
        ("TTFT", canary.ttft_p95_ms, stable.ttft_p95_ms, limits.ttft_p95_ms),
        ("ITL", canary.itl_p95_ms, stable.itl_p95_ms, limits.itl_p95_ms),
    )
    buckets = {
        "TTFT": (canary.ttft_bucket_ms, stable.ttft_bucket_ms),
        "ITL": (canary.itl_bucket_ms, stable.itl_bucket_ms),
    }
    for name, ours, theirs, limit in latencies:
        if ours is not None and limit.value is not None and ours > limit.value:
            return (f"{name} p95 of the canary {_ms(ours)} exceeds the limit {_ms(limit.value)} "
                    f"({limit.source}; stable: {_ms(theirs)})")  # fmt: skip
    if stable.requests < limits.min_requests:
        return ""
    ratio = limits.max_latency_ratio
    for name, ours, theirs, _ in latencies:
        if ours is None or theirs is None or ours <= ratio * theirs:
            continue
        mine, stables = buckets[name]
        if mine is not None and stables is not None and mine[0] < stables[1]:
            continue  # both in one bucket: the ratio is the interpolation's, not measured
        return (
            f"{name} p95 of the canary {_ms(ours)} exceeds {ratio:g} x the stable "
            f"revision's {_ms(theirs)} (spec.rollout.analysis.maxLatencyRatio)"
        )
    return ""
