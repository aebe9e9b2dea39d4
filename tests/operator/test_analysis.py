"""Canary analysis, pure part: the verdict on canary and stable figures, the limits a spec
sets, and the shape of the query (the real Prometheus test runs it)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pytest

from llmfleet.crds import InferenceService
from llmfleet.operator.analysis import (
    Figures,
    Limit,
    Limits,
    combined_query,
    judge,
    limits_for,
    parse,
    quantile,
    queries,
)
from llmfleet.operator.rollout import Verdict

LIMITS = Limits(
    ttft_p95_ms=Limit(500, "spec.slo.ttftP95Ms"),
    itl_p95_ms=Limit(80, "spec.rollout.analysis.maxItlP95Ms"),
    max_error_rate=0.01,
    max_latency_ratio=1.5,
    min_requests=50,
    window_seconds=30,
)
STABLE = Figures(requests=900, errors=1, ttft_p95_ms=200, itl_p95_ms=20)
GOOD = Figures(requests=100, errors=0, ttft_p95_ms=210, itl_p95_ms=21)


def canary(**changes: Any) -> Figures:
    return Figures(**({"requests": 100, "errors": 0, "ttft_p95_ms": 210, "itl_p95_ms": 21}
                      | changes))  # fmt: skip


@dataclass(frozen=True)
class Row:
    id: str
    canary: Figures
    verdict: Verdict
    said: str = ""
    """Words the failed check (or, for other verdicts, the summary) must contain."""
    stable: Figures = STABLE
    limits: Limits = LIMITS


ROWS = [
    Row("healthy-passes", GOOD, Verdict.PASS, "canary 100 requests, 0 errors (0.0%)"),
    Row("too-few-canary-requests-waits", canary(requests=12), Verdict.WAIT,
        "the canary served 12 of the 50 requests a verdict needs in the last 30s"),
    Row("too-few-requests-waits-even-when-failing", canary(requests=12, errors=12),
        Verdict.WAIT),
    Row("no-ttft-measured-waits", canary(ttft_p95_ms=None), Verdict.WAIT,
        "no TTFT measured by the canary's engines"),
    Row("no-itl-measured-waits", canary(itl_p95_ms=None), Verdict.WAIT, "no ITL measured"),
    Row("error-rate-above-the-limit-fails", canary(errors=5), Verdict.FAIL,
        "error rate of the canary 5.0% (5 of 100) exceeds 1.0% (spec.rollout.analysis."
        "maxErrorRate; stable: 0.1%, 1 of 900)"),
    Row("error-rate-at-the-limit-passes", canary(errors=1), Verdict.PASS),
    Row("errors-are-checked-before-latency", canary(errors=50, itl_p95_ms=900), Verdict.FAIL,
        "error rate"),
    Row("ttft-above-the-slo-fails", canary(ttft_p95_ms=612), Verdict.FAIL,
        "TTFT p95 of the canary 612 ms exceeds the limit 500 ms (spec.slo.ttftP95Ms; "
        "stable: 200 ms)"),
    Row("itl-above-the-analysis-limit-fails", canary(itl_p95_ms=95), Verdict.FAIL,
        "ITL p95 of the canary 95.0 ms exceeds the limit 80.0 ms "
        "(spec.rollout.analysis.maxItlP95Ms; stable: 20.0 ms)"),
    Row("itl-relative-to-stable-fails", canary(itl_p95_ms=31), Verdict.FAIL,
        "ITL p95 of the canary 31.0 ms exceeds 1.5 x the stable revision's 20.0 ms"),
    Row("ttft-relative-to-stable-fails", canary(ttft_p95_ms=301), Verdict.FAIL,
        "TTFT p95 of the canary 301 ms exceeds 1.5 x the stable revision's 200 ms"),
    Row("just-within-the-ratio-passes", canary(ttft_p95_ms=300, itl_p95_ms=30), Verdict.PASS),
    Row("stable-too-few-requests-skips-the-ratio", canary(itl_p95_ms=70), Verdict.PASS,
        "stable: too few requests to compare latency with",
        stable=Figures(requests=10, ttft_p95_ms=200, itl_p95_ms=20)),
    Row("stable-without-latency-skips-the-ratio", canary(itl_p95_ms=70), Verdict.PASS,
        stable=Figures(requests=900)),
    Row("no-absolute-limit-only-the-ratio", canary(ttft_p95_ms=2000, itl_p95_ms=25),
        Verdict.FAIL, "exceeds 1.5 x", limits=Limits(min_requests=50)),
    # Within one histogram bucket the ratio is interpolation (CI once rolled back a healthy
    # canary on TTFT 37.9 ms vs 24.0 ms, both in vLLM's 20-40 ms bucket).
    Row("ratio-within-one-bucket-passes",
        canary(ttft_p95_ms=37.9, ttft_bucket_ms=(20.0, 40.0)), Verdict.PASS,
        stable=Figures(requests=900, ttft_p95_ms=24.0, itl_p95_ms=21,
                       ttft_bucket_ms=(20.0, 40.0))),
    Row("ratio-across-buckets-fails",
        canary(ttft_p95_ms=45.0, ttft_bucket_ms=(40.0, 60.0)), Verdict.FAIL,
        "TTFT p95 of the canary 45.0 ms exceeds 1.5 x the stable revision's 24.0 ms",
        stable=Figures(requests=900, ttft_p95_ms=24.0, itl_p95_ms=21,
                       ttft_bucket_ms=(20.0, 40.0))),
    Row("absolute-limit-applies-within-one-bucket",
        canary(itl_p95_ms=95, itl_bucket_ms=(75.0, 100.0)), Verdict.FAIL,
        "exceeds the limit 80.0 ms",
        stable=Figures(requests=900, ttft_p95_ms=200, itl_p95_ms=76,
                       itl_bucket_ms=(75.0, 100.0))),
]  # fmt: skip


@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
def test_judge(row: Row) -> None:
    analysis = judge(row.canary, row.stable, row.limits)
    assert analysis.verdict == row.verdict
    assert (analysis.failed != "") == (row.verdict == Verdict.FAIL)
    assert row.said in (analysis.failed if row.verdict == Verdict.FAIL else analysis.summary)
    # Every verdict carries both sides' figures.
    assert "canary" in analysis.summary
    assert "stable" in analysis.summary


def _spec(slo: dict[str, Any], analysis: dict[str, Any]) -> Any:
    return InferenceService.model_validate(
        {"spec": {"model": {"name": "m"}, "slo": slo, "rollout": {"analysis": analysis}}}
    ).spec


@pytest.mark.parametrize(
    ("slo", "analysis", "ttft", "itl"),
    [
        pytest.param({}, {}, (None, ""), (None, ""), id="neither"),
        pytest.param({"ttftP95Ms": 400, "itlP95Ms": 50}, {}, (400, "spec.slo.ttftP95Ms"),
                     (50, "spec.slo.itlP95Ms"), id="from-the-slo"),
        pytest.param({"ttftP95Ms": 400, "itlP95Ms": 50}, {"maxItlP95Ms": 70},
                     (400, "spec.slo.ttftP95Ms"), (70, "spec.rollout.analysis.maxItlP95Ms"),
                     id="analysis-wins"),
    ],
)  # fmt: skip
def test_limits_for(
    slo: dict[str, Any],
    analysis: dict[str, Any],
    ttft: tuple[float | None, str],
    itl: tuple[float | None, str],
) -> None:
    limits = limits_for(_spec(slo, analysis | {"intervalSeconds": 15, "minRequests": 7}))
    assert (limits.ttft_p95_ms.value, limits.ttft_p95_ms.source) == ttft
    assert (limits.itl_p95_ms.value, limits.itl_p95_ms.source) == itl
    assert (limits.window_seconds, limits.min_requests) == (15, 7)


def test_both_tracks_are_asked_over_the_same_window() -> None:
    found = queries("team", "chat", "abc123", 30)
    assert set(found) == {f"{t}/{f}" for t in ("canary", "stable")
                          for f in ("requests", "errors", "ttft_p95_ms", "itl_p95_ms")}  # fmt: skip
    for key, query in found.items():
        assert "[30s]" in query
        assert ('revision="abc123"' in query) == key.startswith("canary")
        assert ('revision!="abc123"' in query) == key.startswith("stable")
    query = combined_query(found)
    assert query.count('"llmfleet_track"') == 8


def sample(track: str, figure: str, value: str, le: str | None = None) -> dict[str, Any]:
    metric = {"llmfleet_track": track, "llmfleet_figure": figure} | ({"le": le} if le else {})
    return {"metric": metric, "value": [0, value]}


def test_parse_counts_nothing_as_zero_and_no_quantile_as_none() -> None:
    no_samples = [sample("canary", "ttft_p95_ms", "0", le) for le in ("0.02", "0.04", "+Inf")]
    itl = [("0.01", "0"), ("0.025", "10"), ("0.05", "20"), ("+Inf", "20")]
    found = parse([sample("canary", "requests", "12"), *no_samples,
                   *(sample("stable", "itl_p95_ms", value, le) for le, value in itl)])  # fmt: skip
    assert found["canary"] == Figures(requests=12)
    stable = found["stable"]
    assert stable.itl_p95_ms == pytest.approx(47.5)  # 25 + 25 x (19 - 10) / 10
    assert stable.itl_bucket_ms == pytest.approx((25.0, 50.0))
    assert stable.ttft_p95_ms is None


@pytest.mark.parametrize(
    ("buckets", "expected"),
    [
        # vLLM's TTFT buckets; 100 observations, 95th in the 20-40 ms bucket.
        ([(0.01, 0), (0.02, 50), (0.04, 100), (math.inf, 100)], (0.038, 0.02, 0.04)),
        ([(0.01, 0), (0.02, 90), (0.04, 100), (math.inf, 100)], (0.03, 0.02, 0.04)),
        # The first bucket counts from 0.
        ([(0.01, 100), (math.inf, 100)], (0.0095, 0.0, 0.01)),
        # In the +Inf bucket: the highest finite bound, as histogram_quantile answers.
        ([(0.01, 10), (0.02, 20), (math.inf, 100)], (0.02, 0.02, 0.02)),
        # Rates of counters that dip (scrape noise) are made monotonic first.
        ([(0.01, 50), (0.02, 49), (0.04, 100), (math.inf, 100)], (0.038, 0.02, 0.04)),
        # No observations, or no +Inf bucket: nothing measured.
        ([(0.01, 0), (math.inf, 0)], None),
        ([(0.01, 5), (0.02, 10)], None),
    ],
)
def test_quantile_interpolates_as_histogram_quantile(
    buckets: list[tuple[float, float]], expected: tuple[float, float, float] | None
) -> None:
    found = quantile(0.95, buckets)
    if expected is None:
        assert found is None
    else:
        assert found == pytest.approx(expected)
