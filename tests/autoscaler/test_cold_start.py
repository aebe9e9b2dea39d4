"""A pool that meets load far above its capacity (a start from idle, a step): one decision sizes
it from the prompt backlog and the rate, and the misses of a pool that was simply too small do
not cut the capacity model (which would oversize it for the next ten minutes).

Builders' profile: a replica prefills 8,003 prompt tok/s of 1,000-token prompts within the
1,800 ms TTFT target; 10 r streams at 64 per replica.
"""

from __future__ import annotations

import math

import pytest

from llmfleet.autoscaler import PolicyState, PoolState, decide
from llmfleet.autoscaler.goodput import LatencyHistogram
from tests.autoscaler.builders import at, inputs, pool, signals, spec

BOUNDS = (0.5, 1.0, 2.5, 5.0, math.inf)
ALL_LATE = LatencyHistogram(BOUNDS, (0.0, 0.0, 0.0, 0.0, 200.0))
"""200 first tokens in the window, every one over 5 s."""
IDLE = PolicyState({"unified": PoolState(updated_at=at(-15), short_rate=0.0, long_rate=0.0)})


@pytest.mark.parametrize(
    ("active", "spares", "expect", "correction", "says"),
    [
        # 8/s and 40 queued: 8,000 + 40 x 1,000 / 1.8 s = 30,222 tok/s / 8,003 = 3.8 -> 4, in
        # one decision; the misses came from one replica doing four's work: correction kept.
        pytest.param(
            1, 0, (4, 0), 1.0, ("scale up 1 -> 4", "+ 22222 for the 40 queued"), id="from-idle"
        ),
        # The same step with a warm spare: the spare is promoted on this first tick (the
        # operator promotes active - ready spares first) and the spare is kept on top.
        pytest.param(1, 1, (4, 1), 1.0, ("scale up 1 -> 4", "1 warm spares"), id="spare"),
        # Four ready replicas, as the model asks, and still every request late: the model is
        # wrong, so it learns (cut to the floor 0.5): 30,222 / 4,001 = 7.6 -> 8.
        pytest.param(4, 0, (8, 0), 0.5, ("scale up 4 -> 8", "correction 0.50"), id="model-wrong"),
    ],
)
def test_a_step_is_sized_in_one_decision(
    active: int,
    spares: int,
    expect: tuple[int, int],
    correction: float,
    says: tuple[str, ...],
) -> None:
    load = signals(8, waiting=40.0, ttft_histogram=ALL_LATE)
    given = inputs(spec(warm_spares=spares), unified=pool(active, load, spares=spares))
    assert given.pools["unified"].pods.ready == active

    decision = decide(given, IDLE, at(0))

    plan = decision.pools["unified"]
    assert (plan.active, plan.spares) == expect
    assert decision.state.pools["unified"].correction == pytest.approx(correction)
    for phrase in says:
        assert phrase in plan.reason
