"""The floor a pool keeps when its minReplicas is unset (`floor.py`): 2 until its load is measured
light (nothing needed 2 for 30 minutes, nor for twice the longest lull between two needs of 2),
then 1; a user's minReplicas always as written."""

from __future__ import annotations

import pytest

from llmfleet.autoscaler import PolicyState
from llmfleet.autoscaler.floor import floor
from llmfleet.autoscaler.inputs import PolicyConfig, PoolState
from llmfleet.autoscaler.policy import decide
from llmfleet.crds.spec import PoolSpec
from tests.autoscaler.builders import at, inputs, pool, signals, spec

MIN = 60.0
UNSET = PoolSpec(replicas=1)


def _floors(needs: list[tuple[float, int]], pool_spec: PoolSpec = UNSET) -> list[int]:
    """The floor after each (minute, need) decision, memory carried from one to the next."""
    state, result = PoolState(), []
    for minute, need in needs:
        made, state = floor(pool_spec, state, need, at(minute * MIN), PolicyConfig())
        result.append(made.replicas)
    return result


@pytest.mark.parametrize(
    ("needs", "floors"),
    [
        pytest.param(
            [(0, 1), (10, 1), (29, 1), (30, 1), (600, 0)],
            [2, 2, 2, 1, 1],
            id="light-from-the-start-after-30-min",
        ),
        pytest.param(
            [(0, 3), (1, 3), (20, 1), (30, 1), (31, 1)],
            [2, 2, 2, 2, 1],
            id="30-min-counted-from-the-last-need-of-2",
        ),
        pytest.param(
            # The 32 quiet minutes before the need of 2 count as a lull: 64 min to be light.
            [(0, 1), (31, 1), (32, 2), (33, 1), (95, 1), (96, 1)],
            [2, 1, 2, 2, 2, 1],
            id="a-need-of-2-raises-it-at-once",
        ),
        pytest.param(
            # Bursts 25 min apart: once one such lull is seen, 50 min of quiet are needed.
            [(0, 2), (25, 2), (50, 1), (56, 1), (74, 1), (75, 1)],
            [2, 2, 2, 2, 2, 1],
            id="twice-the-longest-lull-between-bursts",
        ),
        pytest.param(
            [(0, 4), (1, 4), (2, 4), (32, 1)],
            [2, 2, 2, 1],
            id="back-to-back-needs-leave-a-short-lull",
        ),
    ],
)
def test_the_floor_when_min_replicas_is_unset(
    needs: list[tuple[float, int]], floors: list[int]
) -> None:
    assert _floors(needs) == floors


@pytest.mark.parametrize("minimum", [0, 1, 2, 3])
def test_a_min_replicas_the_user_set_is_the_floor_whatever_the_load(minimum: int) -> None:
    pool_spec = PoolSpec(replicas=max(minimum, 1), min_replicas=minimum)
    assert _floors([(0, 1), (40, 1), (80, 5), (200, 0)], pool_spec) == [minimum] * 4


def test_a_fresh_memory_starts_at_the_safe_floor() -> None:
    """A pool with no memory (never sized, or its status lost): 2 until measured."""
    made, _ = floor(UNSET, PoolState(), 0, at(10_000), PolicyConfig())
    assert made.replicas == 2
    assert "minReplicas unset" in made.why


def test_the_policy_holds_two_then_scales_a_light_pool_to_one() -> None:
    """0.5 requests/s of 1,000-token prompts need one replica: with minReplicas unset the pool
    keeps two for 30 minutes, then the scale-down window (300 s) takes it to one."""
    service_spec = spec(pools={"unified": {"replicas": 2, "minReplicas": None}})
    state = PolicyState()
    actives: dict[float, int] = {}
    active = 2
    for minute in range(0, 41):
        observed = inputs(service_spec, unified=pool(active, signals(0.5, seconds=minute * 60)))
        made = decide(observed, state, at(minute * 60))
        state, active = made.state, made.pools["unified"].active
        actives[minute] = active
        if minute == 10:
            assert "raised to default floor 2 (minReplicas unset" in made.pools["unified"].reason
    assert actives[29] == 2
    assert actives[34] == 2  # measured light at 30 min; the 300 s window still runs
    assert actives[36] == 1
    assert actives[40] == 1


def test_a_gpu_budget_of_one_pod_trims_the_policys_own_floor() -> None:
    """Admission counts an unset minReplicas as 1, so a budget of one pod is valid: the floor of
    2 the policy would keep gives way to it, and the reason says so."""
    service_spec = spec(pools={"unified": {"replicas": 1, "minReplicas": None}}, gpu_budget=1)
    observed = inputs(service_spec, unified=pool(1, signals(0.5)))
    made = decide(observed, PolicyState(), at(0)).pools["unified"]
    assert made.active == 1
    assert "raised to default floor 2" in made.reason
    assert "GPU budget 1 reached" in made.reason
