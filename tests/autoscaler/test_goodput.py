"""Goodput from histogram buckets (`goodput.py`) and what the policy's correction learns from it.

Histograms use vLLM's TTFT bounds around the builders' 1,800 ms target: ... 1.0, 2.5, 5.0 s, so
the target is not a boundary: misses are read at 2.5 s, comfort (0.6 x 1,800 = 1,080 ms) at 1.0 s.
"""

from __future__ import annotations

import math

import pytest

from llmfleet.autoscaler import PolicyConfig, PolicyState, PoolState, decide
from llmfleet.autoscaler.goodput import (
    LatencyHistogram,
    Over,
    Round,
    capacity_misses,
    implied_ratio,
    over,
    wilson_lower,
)
from llmfleet.crds.inference_service import SloMisses
from tests.autoscaler.builders import at, inputs, pool, signals, spec

BOUNDS = (0.5, 1.0, 2.5, 5.0)


def histogram(*per_bucket: float) -> LatencyHistogram:
    """Requests per bucket (0-0.5, 0.5-1, 1-2.5, 2.5-5, over 5 s) as cumulative counts."""
    counts, total = [], 0.0
    for n in per_bucket:
        total += n
        counts.append(total)
    return LatencyHistogram((*BOUNDS, math.inf), tuple(counts))


H = histogram(50, 30, 12, 6, 2)  # 100 requests


@pytest.mark.parametrize(
    ("latency_s", "rounding", "expected"),
    [
        pytest.param(1.0, Round.UP, Over(20, 100, 1.0), id="on-a-boundary-exact"),
        pytest.param(1.0, Round.DOWN, Over(20, 100, 1.0), id="on-a-boundary-either-way"),
        pytest.param(1.8, Round.UP, Over(8, 100, 2.5), id="misses-at-the-next-boundary"),
        pytest.param(1.8, Round.DOWN, Over(20, 100, 1.0), id="comfort-at-the-previous-boundary"),
        pytest.param(0.2, Round.DOWN, Over(100, 100, 0.0), id="below-the-lowest-bound-none"),
        pytest.param(0.2, Round.UP, Over(50, 100, 0.5), id="below-the-lowest-bound-up"),
        pytest.param(9.0, Round.UP, Over(0, 100, math.inf), id="above-every-bound-up-is-inf"),
        pytest.param(9.0, Round.DOWN, Over(2, 100, 5.0), id="above-every-bound-down"),
    ],
)
def test_requests_over_a_latency(latency_s: float, rounding: Round, expected: Over) -> None:
    assert over(H, latency_s, rounding) == expected


def test_a_histogram_of_samples_is_cumulative_and_its_total_is_the_count() -> None:
    made = LatencyHistogram.of([0.3, 0.5, 0.7, 3.0, 6.0], BOUNDS)
    assert made.counts == (2.0, 3.0, 3.0, 4.0, 5.0)  # le is inclusive: 0.5 counts in the 0.5 bucket
    assert made.total == 5
    assert made.invalid() == ""


@pytest.mark.parametrize(
    ("counts", "why"),
    [
        pytest.param((1.0, 2.0, math.nan, 3.0, 3.0), "counts", id="nan"),
        pytest.param((1.0, -2.0, 2.0, 3.0, 3.0), "counts", id="negative"),
        pytest.param((5.0, 2.0, 3.0, 3.0, 3.0), "not cumulative", id="a-reset-inside-the-window"),
    ],
)
def test_broken_counts_are_invalid(counts: tuple[float, ...], why: str) -> None:
    assert why in LatencyHistogram((*BOUNDS, math.inf), counts).invalid()


def test_a_histogram_needs_the_inf_bucket() -> None:
    with pytest.raises(ValueError, match=r"\+Inf"):
        LatencyHistogram(BOUNDS, (1.0, 2.0, 3.0, 4.0))


@pytest.mark.parametrize(
    ("late", "lower"),
    [
        pytest.param(Over(0, 10, 1), 0.0, id="none-over"),
        pytest.param(Over(1, 10, 1), 0.0226, id="one-of-ten-is-weak-evidence"),
        pytest.param(Over(100, 1000, 1), 0.0855, id="a-hundred-of-a-thousand"),
        pytest.param(Over(10, 10, 1), 0.787, id="all-of-ten"),
        pytest.param(Over(0, 0, 1), 0.0, id="no-requests"),
    ],
)
def test_wilson_lower_bound(late: Over, lower: float) -> None:
    assert wilson_lower(late, 1.645) == pytest.approx(lower, abs=5e-4)


@pytest.mark.parametrize(
    ("share", "allowed", "ratio"),
    [
        pytest.param(0.01, 0.01, 1.0, id="exactly-the-allowance"),
        pytest.param(0.02, 0.01, math.log(50) / math.log(100), id="twice-the-allowance"),
        pytest.param(0.10, 0.01, 0.5, id="ten-times"),
        pytest.param(0.0, 0.05, math.inf, id="none-over"),
        pytest.param(1.0, 0.05, 0.0, id="all-over"),
    ],
)
def test_implied_ratio_under_an_exponential_tail(
    share: float, allowed: float, ratio: float
) -> None:
    assert implied_ratio(share, allowed) == pytest.approx(ratio)


def _learnt(ttft: LatencyHistogram, *, p95: float | None = None, correction: float = 1.0) -> float:
    state = PolicyState({"unified": PoolState(updated_at=at(-15), correction=correction)})
    load = signals(8, ttft_histogram=ttft, ttft_p95_ms=p95)
    decision = decide(inputs(spec(), unified=pool(4, load)), state, at(0))
    return decision.state.pools["unified"].correction


def prefill(*per_bucket: float) -> LatencyHistogram:
    """Requests per prefill-time bucket in vLLM's request-latency bounds around the target:
    0-1, 1-2.5, 2.5-5, over 5 s."""
    counts, total = [], 0.0
    for n in per_bucket:
        total += n
        counts.append(total)
    return LatencyHistogram((1.0, 2.5, 5.0, math.inf), tuple(counts))


@pytest.mark.parametrize(
    ("ttft", "own", "expected"),
    [
        pytest.param(over(H, 1.8), None, Over(8, 100, 2.5), id="no-prefill-histogram-as-read"),
        # 3 requests took over 2.5 s in prefill alone: their TTFT is over 2.5 s too.
        pytest.param(
            over(H, 1.8), prefill(90, 7, 2, 1), Over(5, 97, 2.5, 3), id="prefill-bound-left-out"
        ),
        # vLLM observes the prefill time at the finish: a window may hold more prefill-bound
        # requests (10) than TTFT misses (8); no more than those are left out.
        pytest.param(
            over(H, 1.8),
            prefill(80, 10, 9, 1),
            Over(0, 92, 2.5, 8),
            id="more-than-the-window-missed-clamped",
        ),
        # The TTFT read at 1.0 s; the prefill histogram's next bound at or above it is 1.0.
        pytest.param(
            over(H, 1.0), prefill(95, 4, 1, 0), Over(15, 95, 1.0, 5), id="at-a-shared-boundary"
        ),
        pytest.param(
            over(H, 9.0), prefill(0, 0, 0, 100), Over(0, 100, math.inf), id="nothing-to-subtract"
        ),
        pytest.param(over(H, 1.8), prefill(0, 0, 0, 0), Over(8, 100, 2.5), id="empty-prefill"),
    ],
)
def test_capacity_misses_leave_out_what_prefill_alone_missed(
    ttft: Over, own: LatencyHistogram | None, expected: Over
) -> None:
    assert capacity_misses(ttft, own) == expected


def test_prefill_bound_misses_do_not_cut_the_correction() -> None:
    """The window that cuts to 0.821 above (100 of 1,000 over 2.5 s), when the prefill phase
    of each of those 100 alone took over 2.5 s: a long prompt's own TTFT, no capacity error."""
    state = PolicyState({"unified": PoolState(updated_at=at(-15), correction=1.0)})
    ttft, own = histogram(500, 300, 100, 60, 40), prefill(800, 100, 60, 40)
    load = signals(8, ttft_histogram=ttft, prefill_histogram=own)
    decision = decide(inputs(spec(), unified=pool(4, load)), state, at(0))
    assert decision.state.pools["unified"].correction == 1.0
    assert "goodput 0.0% of 900 over 2500 ms" in decision.pools["unified"].reason
    assert "100 prefill-bound left out" in decision.pools["unified"].reason


@pytest.mark.parametrize(
    ("ttft", "p95", "before", "after"),
    [
        # 100 of 1,000 over 2.5 s: Wilson lower 8.55% against the 5% a p95 target allows:
        # ln(1/0.0855)/ln 20 = 0.821.
        pytest.param(histogram(500, 300, 100, 60, 40), None, 1.0, 0.821, id="misses-cut"),
        # 1 of 10 over (a 10% share, p95 far above target) is no evidence beyond chance: the
        # Wilson bound 2.3% < 5%; the goodput wins over the p95 that would have cut to 0.6.
        pytest.param(histogram(5, 3, 1, 1, 0), 3000.0, 1.0, 1.0, id="a-handful-does-not-cut"),
        # 4% over 1.0 s (within 5% of 1,080 ms comfort, read at 1.0 s): comfortable, recovers
        # towards 1 by 1 - e^(-15/600) of the gap.
        pytest.param(
            histogram(600, 360, 30, 10, 0),
            None,
            0.5,
            1 - 0.5 * math.exp(-15 / 600),
            id="comfortable-recovers",
        ),
        # 2.5-5 s empty, 15% between 1.0 and 2.5 s: neither certain misses nor comfort: hold.
        pytest.param(histogram(500, 350, 150, 0, 0), None, 0.5, 0.5, id="inside-the-bucket-holds"),
        # No request in the window: the p95 is all there is (here none either): unchanged.
        pytest.param(histogram(0, 0, 0, 0, 0), None, 0.7, 0.7, id="empty-window-unchanged"),
        # No histogram exported: the p95 decides, as before goodput (1,800/3,600).
        pytest.param(None, 3600.0, 1.0, 0.5, id="no-histogram-p95-fallback"),
    ],
)
def test_the_correction_learns_from_goodput(
    ttft: LatencyHistogram | None, p95: float | None, before: float, after: float
) -> None:
    assert _learnt(ttft, p95=p95, correction=before) == pytest.approx(after, abs=5e-4)  # type: ignore[arg-type]


def test_the_allowance_follows_the_slos_percentile() -> None:
    # 3% over 2.5 s of 1,000: within a p95 target's 5% allowance, a miss for a p99 target
    # (Wilson lower 2.23% > 1%: ln(1/0.0223)/ln 100 = 0.826).
    ttft = histogram(600, 300, 70, 20, 10)
    load = signals(8, ttft_histogram=ttft)
    given = inputs(spec(), unified=pool(4, load))
    p95 = decide(given, PolicyState(), at(0))
    p99 = decide(given, PolicyState(), at(0), PolicyConfig(latency_quantile=0.99))
    assert p95.state.pools["unified"].correction == 1.0
    assert p99.state.pools["unified"].correction == pytest.approx(0.826, abs=5e-4)
    assert "goodput 3.0% of 1000 over 2500 ms (allowed 1%)" in p99.pools["unified"].reason


def test_an_invalid_histogram_holds_fail_static() -> None:
    broken = LatencyHistogram((*BOUNDS, math.inf), (5.0, 2.0, 3.0, 3.0, 3.0))
    decision = decide(
        inputs(spec(), unified=pool(2, signals(24, ttft_histogram=broken))), PolicyState(), at(0)
    )
    assert decision.pools["unified"].active == 2
    assert (
        "metrics invalid (ttft_histogram counts not cumulative" in decision.pools["unified"].reason
    )


@pytest.mark.parametrize(
    ("load", "expected"),
    [
        # 1,000 requests, 100 over 2.5 s, each of them over 2.5 s in its own prefill: the SLO
        # is missed, and no replica would have helped.
        pytest.param(
            {"ttft_histogram": histogram(500, 300, 100, 60, 40),
             "prefill_histogram": prefill(800, 100, 60, 40)},
            SloMisses(bound_ms=2500, requests=1000, capacity=0, prompt_too_long=100),
            id="every-miss-a-prompt-too-long",
        ),
        pytest.param(
            {"ttft_histogram": histogram(500, 300, 100, 60, 40),
             "prefill_histogram": prefill(880, 100, 15, 5)},
            SloMisses(bound_ms=2500, requests=1000, capacity=80, prompt_too_long=20),
            id="mostly-short-of-capacity",
        ),
        pytest.param(
            {"ttft_histogram": histogram(500, 300, 100, 60, 40)},
            SloMisses(bound_ms=2500, requests=1000, capacity=100, prompt_too_long=0),
            id="no-prefill-histogram-every-miss-counts-as-capacity",
        ),
        pytest.param({}, None, id="no-histogram-nothing-said"),
        pytest.param(
            {"ttft_histogram": histogram(0, 0, 0, 0, 0)}, None, id="no-request-nothing-said"
        ),
    ],
)  # fmt: skip
def test_the_decision_says_which_misses_capacity_would_fix(
    load: dict[str, LatencyHistogram], expected: SloMisses | None
) -> None:
    decision = decide(inputs(spec(), unified=pool(4, signals(8, **load))), PolicyState(), at(0))
    assert decision.pools["unified"].ttft_misses == expected
    written = decision.status().pools["unified"].ttft_misses
    assert written == expected


INF = math.inf


@pytest.mark.parametrize(
    ("bounds", "counts", "q", "expected"),
    [
        # Prometheus 2.42 `bucketQuantile`, case by case.
        pytest.param((0.1, 0.2, INF), (50, 100, 100), 0.5, 0.1, id="rank-at-a-bound"),
        pytest.param((0.1, 0.2, INF), (0, 100, 100), 0.95, 0.195, id="interpolated"),
        pytest.param((0.1, 0.2, INF), (100, 100, 100), 0.5, 0.05, id="lowest-bucket-from-0"),
        pytest.param((0.1, 0.2, INF), (10, 20, 100), 0.95, 0.2, id="in-inf-highest-bound"),
        pytest.param((-1.0, 0.2, INF), (60, 100, 100), 0.5, -1.0, id="lowest-bound-not-positive"),
        pytest.param((0.1, 0.2, INF), (0, 0, 0), 0.95, None, id="no-requests-nan"),
        pytest.param((INF,), (10,), 0.5, None, id="only-inf-nan"),
        # Made monotonic: a dip (increase() extrapolates each bucket alone) counts as flat.
        pytest.param((0.1, 0.2, 0.4, INF), (60, 50, 100, 100), 0.65, 0.225, id="dip-made-flat"),
    ],
)
def test_quantile_is_promqls_histogram_quantile(
    bounds: tuple[float, ...], counts: tuple[float, ...], q: float, expected: float | None
) -> None:
    found = LatencyHistogram(bounds, tuple(float(c) for c in counts)).quantile(q)
    assert found == (None if expected is None else pytest.approx(expected))
