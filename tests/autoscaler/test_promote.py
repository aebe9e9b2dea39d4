"""The fast pass's spare promotion (`promote.py`, `policy.decide_fast`): a table of pools, each
row the counts and gauges a fast pass sees and the active count and phrase it decides.

8 requests/s of 1,000-token prompts needs 2 replicas by the sizing model (80 streams at 64 per
replica; the builders' profile): every row runs 2 serving pods that the model finds enough, so
what adds a pod here is the queue alone. The state is the last full pass's.
"""

from __future__ import annotations

from typing import Any

import pytest

from llmfleet.autoscaler import PolicyState, PoolState, decide
from llmfleet.autoscaler.inputs import PolicyConfig
from llmfleet.autoscaler.policy import decide_fast
from tests.autoscaler.builders import at, inputs, pool, signals, spec

STATE = PolicyState({"unified": PoolState(updated_at=at(0), short_rate=8.0, long_rate=8.0)})

ROWS = [
    # (spec options, pool options, waiting, (active, spares, reason phrase) expected)
    pytest.param(
        {"warm_spares": 1}, {"spares": 1}, 1.0,
        (3, 1, "promote a warm spare 2 -> 3: 1 requests queued"),
        id="one-queued-request-promotes-the-spare-and-keeps-one-spare-to-backfill",
    ),
    pytest.param(
        {"warm_spares": 2}, {"spares": 2}, 8.0, (3, 2, "promote a warm spare 2 -> 3"),
        id="one-spare-per-pass-while-the-model-finds-the-pool-big-enough",
    ),
    pytest.param(
        {"warm_spares": 1}, {"spares": 1}, 0.0, (2, 1, "holding 2"),
        id="no-queue-no-promotion",
    ),
    pytest.param(
        {"warm_spares": 1}, {"spares": 1}, 0.5, (2, 1, "holding 2"),
        id="below-the-threshold-mean-of-a-scrape",
    ),
    pytest.param(
        {}, {}, 5.0, (2, 0, "holding 2"),
        id="no-spares-nothing-to-promote-the-model-decides",
    ),
    pytest.param(
        {"warm_spares": 1}, {"spares": 1, "ready_spares": 0}, 5.0, (2, 1, "holding 2"),
        id="the-spare-is-still-starting",
    ),
    pytest.param(
        {"warm_spares": 1}, {"spares": 1, "starting": 1}, 5.0, (2, 1, "holding 2"),
        id="a-promoted-pod-not-serving-yet-waits-flapping-guard",
    ),
    pytest.param(
        {"warm_spares": 1, "pools": {"unified": {"maxReplicas": 2}}}, {"spares": 1}, 5.0,
        (2, 1, "holding 2"),
        id="at-max-replicas",
    ),
    pytest.param(
        {"warm_spares": 1, "gpu_budget": 3}, {"spares": 1}, 5.0,
        (3, 0, "GPU budget 3 reached"),
        id="the-gpu-budget-promotes-without-a-replacement",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("service", "options", "waiting", "expected"), ROWS)
def test_fast_pass_promotes_a_spare_on_a_queue(
    service: dict[str, Any],
    options: dict[str, Any],
    waiting: float,
    expected: tuple[int, int, str],
) -> None:
    active, spares, phrase = expected
    load = signals(8, waiting=waiting)

    decision = decide_fast(inputs(spec(**service), unified=pool(2, load, **options)), STATE, at(5))

    plan = decision.pools["unified"]
    assert (plan.active, plan.spares) == (active, spares), plan.reason
    assert plan.reason.startswith("fast pass: ")
    assert phrase in plan.reason
    assert decision.state == STATE


def test_the_threshold_is_a_setting() -> None:
    load = signals(8, waiting=3.0)
    service = inputs(spec(warm_spares=1), unified=pool(2, load, spares=1))

    lenient = decide_fast(service, STATE, at(5), PolicyConfig(promote_waiting=3.0))
    strict = decide_fast(service, STATE, at(5), PolicyConfig(promote_waiting=4.0))

    assert lenient.pools["unified"].active == 3
    assert strict.pools["unified"].active == 2


def test_a_promoted_spare_is_demoted_only_by_the_full_passs_window() -> None:
    # The fast pass promoted 2 -> 3; the queue is gone and the model needs 2. The full pass
    # holds 3 through the 300 s window (the normal scale-down) and only then returns to 2.
    promoted = decide_fast(
        inputs(spec(warm_spares=1), unified=pool(2, signals(8, waiting=4.0), spares=1)),
        STATE,
        at(5),
    )
    assert promoted.pools["unified"].active == 3

    state = STATE
    seen = []
    for seconds in (10, 150, 320):
        full = decide(
            inputs(spec(warm_spares=1), unified=pool(3, signals(8, seconds=seconds), spares=1)),
            state,
            at(seconds),
        )
        state = full.state
        seen.append(full.pools["unified"].active)
    assert seen == [3, 3, 2]
