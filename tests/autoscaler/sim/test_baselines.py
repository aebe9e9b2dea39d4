"""Baselines' rules on short timelines of observations."""

from __future__ import annotations

from dataclasses import replace

import pytest

from llmfleet.autoscaler.sim.baselines import AibrixKpa, DynamoPlanner, KedaQueue, LlmdSloRatio
from llmfleet.autoscaler.sim.model import EngineModel
from llmfleet.autoscaler.sim.observe import Observation
from llmfleet.autoscaler.sim.profile import engine_profile

BASE = Observation(
    now=0.0,
    request_rate=0.0,
    prompt_tokens_rate=0.0,
    mean_prompt_tokens=0.0,
    mean_output_tokens=0.0,
    arrival_rate=0.0,
    arrival_prompt_tokens=0.0,
    arrival_output_tokens=0.0,
    running=0.0,
    waiting=0.0,
    kv_cache_usage=0.0,
    ttft_p95_ms=None,
    itl_p95_ms=None,
    peak_prompt_tokens_rate=0.0,
    active=2,
    spares=0,
    ready=2,
    starting=0,
    pods=(),
)


def at(t: float, **fields: float | int | None) -> Observation:
    return replace(BASE, now=t, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("waiting", "active", "expected"),
    [
        pytest.param(40.0, 2, 6, id="up-to-ceil-waiting-over-5-capped-by-hpa-rate"),
        pytest.param(10.5, 2, 2, id="within-hpa-tolerance"),
        pytest.param(30.0, 4, 6, id="up-to-6"),
    ],
)
def test_keda_scales_up_to_waiting_over_threshold(
    waiting: float, active: int, expected: int
) -> None:
    keda = KedaQueue(active)
    assert keda.decide(at(15.0, waiting=waiting, active=active)) == (expected, 0)


def test_keda_scales_down_only_after_the_300_s_cooldown() -> None:
    keda = KedaQueue(1)
    assert keda.decide(at(15.0, waiting=30.0, active=1))[0] == 5
    timeline = [keda.decide(at(15.0 * k, waiting=0.0, active=5))[0] for k in range(2, 23)]
    assert timeline[:19] == [5] * 19  # 15 s .. 300 s after the high recommendation
    assert timeline[-1] == 1


def test_llmd_ratio_thresholds() -> None:
    llmd = LlmdSloRatio(2, ttft_ms=1000, itl_ms=50)
    assert llmd.decide(at(15.0, ttft_p95_ms=1100.0, itl_p95_ms=10.0))[0] == 4  # r=1.1 -> 2x
    assert llmd.decide(at(30.0, ttft_p95_ms=500.0, itl_p95_ms=10.0, active=4))[0] == 4  # hold
    # below 0.40: down by one, but only once the HPA's 300 s window forgets the 4
    assert llmd.decide(at(45.0, ttft_p95_ms=100.0, itl_p95_ms=5.0, active=4))[0] == 4
    assert llmd.decide(at(400.0, ttft_p95_ms=100.0, itl_p95_ms=5.0, active=4))[0] == 3


def test_dynamo_acts_every_180_s_on_the_last_interval_mean() -> None:
    profile = engine_profile(EngineModel().for_slo(50.0))
    dynamo = DynamoPlanner(1, profile, itl_ms=50.0)
    tps = profile.prefill_tokens_per_second
    assert tps is not None
    load = {"arrival_rate": 10.0, "arrival_prompt_tokens": tps / 2, "arrival_output_tokens": 10.0}
    decisions = [dynamo.decide(at(15.0 * k, **load))[0] for k in range(1, 13)]
    assert decisions[:11] == [1] * 11  # nothing before 180 s
    assert decisions[11] == 5  # 10 req/s x tps/2 tokens = 5 replicas' prefill


def test_kpa_panics_on_a_doubling_and_does_not_shrink_while_panicking() -> None:
    kpa = AibrixKpa(1)
    assert kpa.decide(at(15.0, running=4.0, active=1, ready=1))[0] == 1
    # panic window mean (4+36)/2=20 -> 4 pods, >= 2x the 1 ready
    assert kpa.decide(at(30.0, running=36.0, active=1, ready=1))[0] == 4
    # load gone, still panicking: no scale-down
    assert kpa.decide(at(45.0, running=0.0, active=4, ready=4))[0] == 4
    later = [kpa.decide(at(45.0 + 15 * k, running=0.0, active=4, ready=4))[0] for k in range(1, 13)]
    assert later[-1] < 4
