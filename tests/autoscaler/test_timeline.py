"""The policy over time: each row is a sequence of (seconds after T0, request rate) samples fed
to `decide` with the state it returned last, the pool running what was decided; the expected
active count and a phrase of the reason at every step. Unified pool, window 300 s, the builders'
profile: rate r needs max(ceil(r/8), ceil(10 r/64)) replicas (prefill at 8,000 tok/s of
1,000-token prompts, 10 r streams at 64 per replica).
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from llmfleet.autoscaler import PolicyState, PoolState, decide
from llmfleet.autoscaler.policy import decide_fast
from tests.autoscaler.builders import at, inputs, pool, signals, spec

Step = tuple[float, float, int, str]
"""(seconds, rate, active expected, phrase of the reason)."""

TIMELINES = [
    pytest.param(
        4,
        [
            (0, 24, 4, "steady at 4"),  # 240/64 = 3.75 -> 4
            (60, 16, 4, "fits in 3 for 0 s of the 300 s"),  # 160/64 = 2.5 -> 3
            (200, 12, 4, "fits in 2 for 140 s of the 300 s"),  # 120/64 = 1.9 -> 2
            # 300 s after the need first fell: down to the highest need of the window, 3.
            (360, 12, 3, "scale down 4 -> 3"),
            (420, 12, 3, "fits in 2 for 0 s of the 300 s"),
            (720, 12, 2, "scale down 3 -> 2"),
        ],
        id="slow-decline-steps-down-after-each-window",
    ),
    pytest.param(
        4,
        [
            (0, 24, 4, "steady at 4"),
            (100, 12, 4, "fits in 2 for 0 s"),
            # Back up. short = 23.6, long = 21.6 (EWMAs, 30 s and 300 s): forecast 24.45/s,
            # 244.5/64 = 3.8 -> 4 = current: the window starts over.
            (200, 24, 4, "steady at 4"),
            # 350 s after the first dip, but only 0 s into this one: no scale-down.
            (450, 12, 4, "fits in 2 for 0 s"),
            (750, 12, 2, "scale down 4 -> 2"),
        ],
        id="load-back-within-the-window-restarts-it",
    ),
    pytest.param(
        1,
        [
            (0, 8, 2, "scale up 1 -> 2"),  # 80/64 -> 2
            (10, 8, 2, "steady at 2"),
            # 40/s: short = 8 + (1 - e^-1/3) x 32 = 17.1, long = 8 + (1 - e^-1/30) x 32 =
            # 9.05, burst; forecast 40 + (17.1 - 9.05)/270 x 60 = 41.8/s: 418/64 -> 7.
            (20, 40, 7, "burst"),
        ],
        id="step-then-burst",
    ),
]


@pytest.mark.parametrize(("start", "steps"), TIMELINES)
def test_timeline(start: int, steps: list[Step]) -> None:
    service, state, active = spec(), PolicyState(), start
    for seconds, rate, expected, phrase in steps:
        decision = decide(
            inputs(service, unified=pool(active, signals(rate, seconds=seconds))),
            state,
            at(seconds),
        )
        state, active = decision.state, decision.pools["unified"].active
        reason = decision.pools["unified"].reason
        assert (seconds, active) == (seconds, expected), reason
        assert phrase in reason, (seconds, reason)


def test_burst_holds_a_due_scale_down() -> None:
    # Need fell 400 s ago (window 300 s) but the rate jumps 2 -> 8/s: short = 2 + 0.283 x 6
    # = 3.70, long = 2 + 0.033 x 6 = 2.20, a burst; forecast 8.33/s needs 2 < 4, yet 4 stay.
    state = PolicyState(
        {
            "unified": PoolState(
                updated_at=at(-10), short_rate=2.0, long_rate=2.0, low_since=at(-400), low_peak=2
            )
        }
    )

    decision = decide(inputs(spec(), unified=pool(4, signals(8))), state, at(0))

    assert decision.pools["unified"].active == 4
    assert "holding 4 during a burst (load fits in 2)" in decision.pools["unified"].reason
    # The burst holds the scale-down but keeps its window: a pool that bursts every few
    # minutes must not stay at an old peak for as long as its bursts go on.
    assert decision.state.pools["unified"].low_since == at(-400)
    assert decision.state.pools["unified"].low_peak == 2

    # Once the burst has passed (2/s again, both averages settled), the due scale-down
    # happens at once, to the highest need the window saw, the burst's included.
    calm = PolicyState(
        {"unified": replace(decision.state.pools["unified"], short_rate=2.0, long_rate=2.0)}
    )
    after = decide(inputs(spec(), unified=pool(4, signals(2, seconds=15))), calm, at(15))

    assert after.pools["unified"].active == 2
    assert "scale down 4 -> 2" in after.pools["unified"].reason


def test_one_latency_sample_corrects_capacity_once() -> None:
    # TTFT 2,400 ms against 1,800: correction 1,800/2,400 = 0.75. Deciding again 5 s later on
    # the same sample (Prometheus has not scraped since) must not cut it again to 0.5625.
    given = inputs(spec(), unified=pool(4, signals(24, ttft_p95_ms=2400.0)))

    first = decide(given, PolicyState(), at(0))
    second = decide(given, first.state, at(5))

    assert first.state.pools["unified"].correction == 0.75
    assert second.state.pools["unified"].correction == 0.75
    assert "correction 0.75" in second.pools["unified"].reason


def test_correction_holds_near_the_target_and_recovers_by_time_when_comfortable() -> None:
    learnt = PolicyState({"unified": PoolState(updated_at=at(-15), correction=0.5)})

    def ttft(ms: float, seconds: float, state: PolicyState) -> PolicyState:
        load = signals(8, ttft_p95_ms=ms, seconds=seconds)
        return decide(inputs(spec(), unified=pool(4, load)), state, at(seconds)).state

    # 1,400 ms: within the 1,800 ms target but above 0.6 x 1,800 = 1,080 ms: the pool is sized
    # right, so the correction holds (recovering here would shrink it into a miss again).
    held = ttft(1400.0, 0, learnt)
    assert held.pools["unified"].correction == 0.5

    # 900 ms is comfortable: the gap to 1.0 closes with a 600 s time constant, by elapsed time,
    # so one sample 60 s later and four samples 15 s apart recover alike: 1 - 0.5 e^-0.1.
    once = ttft(900.0, 60, held)
    stepped = held
    for seconds in (15, 30, 45, 60):
        stepped = ttft(900.0, seconds, stepped)
    expected = 1 - 0.5 * math.exp(-60 / 600)
    assert once.pools["unified"].correction == pytest.approx(expected)
    assert stepped.pools["unified"].correction == pytest.approx(expected)


def test_fast_pass_scales_up_on_a_queue_and_learns_nothing() -> None:
    # 8/s steady at 2 (streams 80/64 -> 2). The gauges now show 20 requests of 1,000 tokens
    # queued: clearing them within 1.8 s adds 11,111 tok/s to the 8,000 arriving, 19,111/8,003
    # -> 3 replicas, on this pass rather than the next full one.
    state = PolicyState(
        {"unified": PoolState(updated_at=at(0), short_rate=8.0, long_rate=8.0, correction=0.9)}
    )
    queued = signals(8, waiting=20.0)

    decision = decide_fast(inputs(spec(), unified=pool(2, queued)), state, at(5))

    assert decision.pools["unified"].active == 3
    assert decision.pools["unified"].reason.startswith("fast pass: scale up 2 -> 3")
    assert "for the 20 queued requests" in decision.pools["unified"].reason
    assert decision.state == state


def test_fast_pass_never_scales_down() -> None:
    # 6 run where 8/s needs 2: the full pass would start the scale-down window; the fast pass
    # keeps the count and leaves the window to the full pass.
    state = PolicyState({"unified": PoolState(updated_at=at(0), short_rate=8.0, long_rate=8.0)})

    decision = decide_fast(inputs(spec(), unified=pool(6, signals(8))), state, at(5))

    assert (decision.pools["unified"].active, decision.pools["unified"].spares) == (6, 0)
    assert decision.pools["unified"].reason == "fast pass: holding 6"
    assert decision.state == state
