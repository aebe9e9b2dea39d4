"""Baselines' rules on short timelines of observations."""

from __future__ import annotations

from dataclasses import replace

import pytest

from llmfleet.autoscaler.sim.baselines import (
    AibrixKpa,
    DynamoPlanner,
    DynamoProfile,
    KedaQueue,
    LlmdSloRatio,
)
from llmfleet.autoscaler.sim.model import EngineModel
from llmfleet.autoscaler.sim.observe import Observation

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
    keda = KedaQueue(active, threshold=5.0)
    assert keda.decide(at(15.0, waiting=waiting, active=active)) == (expected, 0)


def test_keda_scales_down_only_after_the_300_s_cooldown() -> None:
    keda = KedaQueue(1, threshold=5.0)
    assert keda.decide(at(15.0, waiting=30.0, active=1))[0] == 5
    timeline = [keda.decide(at(15.0 * k, waiting=0.0, active=5))[0] for k in range(2, 23)]
    assert timeline[:19] == [5] * 19  # 15 s .. 300 s after the high recommendation
    assert timeline[-1] == 1


def test_llmd_ratio_thresholds() -> None:
    llmd = LlmdSloRatio(2, ttft_ms=1000, itl_ms=50, up_above=0.55, down_below=0.40)
    assert llmd.decide(at(15.0, ttft_p95_ms=1100.0, itl_p95_ms=10.0))[0] == 4  # r=1.1 -> 2x
    assert llmd.decide(at(30.0, ttft_p95_ms=500.0, itl_p95_ms=10.0, active=4))[0] == 4  # hold
    # below 0.40: down by one, but only once the HPA's 300 s window forgets the 4
    assert llmd.decide(at(45.0, ttft_p95_ms=100.0, itl_p95_ms=5.0, active=4))[0] == 4
    assert llmd.decide(at(400.0, ttft_p95_ms=100.0, itl_p95_ms=5.0, active=4))[0] == 3


def test_dynamo_acts_every_180_s_on_the_last_interval_mean() -> None:
    model = EngineModel().for_slo(50.0)
    profile = DynamoProfile(model)
    dynamo = DynamoPlanner(1, profile, itl_ms=50.0)
    isl = 2000.0
    # Half an engine's prefill at that ISL and a few output tokens: 1 replica ...
    half = profile.prefill_tps(isl) / isl / 2
    load = {"arrival_rate": half, "arrival_prompt_tokens": isl, "arrival_output_tokens": 10.0}
    decisions = [dynamo.decide(at(15.0 * k, **load))[0] for k in range(1, 13)]
    assert decisions[:11] == [1] * 11  # nothing before 180 s
    assert decisions[11] == 1
    # ... ten times that: 5 engines' prefill and the decode share on top: 6.
    load["arrival_rate"] = 10 * half
    decisions = [dynamo.decide(at(180.0 + 15.0 * k, **load))[0] for k in range(1, 13)]
    assert decisions[-1] == 6


def test_dynamo_corrects_decode_by_observed_itl() -> None:
    profile = DynamoProfile(EngineModel().for_slo(50.0))
    load = {"arrival_rate": 40.0, "arrival_prompt_tokens": 100.0, "arrival_output_tokens": 500.0}
    planned = DynamoPlanner(1, profile, itl_ms=50.0, interval_s=15.0)
    expected = profile.itl_s(100, 350) * 1000
    on_profile = planned.decide(at(15.0, **load, itl_mean_ms=expected, running=200.0, ready=2))
    slower = DynamoPlanner(1, profile, itl_ms=50.0, interval_s=15.0)
    slow = slower.decide(at(15.0, **load, itl_mean_ms=10 * expected, running=200.0, ready=2))
    assert slow[0] > on_profile[0]


def test_kpa_panics_on_a_doubling_and_does_not_shrink_while_panicking() -> None:
    kpa = AibrixKpa(1)
    assert kpa.decide(at(15.0, running=4.0, active=1, ready=1))[0] == 1
    # panic window mean (4+36)/2=20 -> 4 pods, >= 2x the 1 ready
    assert kpa.decide(at(30.0, running=36.0, active=1, ready=1))[0] == 4
    # load gone, still panicking: no scale-down
    assert kpa.decide(at(45.0, running=0.0, active=4, ready=4))[0] == 4
    later = [kpa.decide(at(45.0 + 15 * k, running=0.0, active=4, ready=4))[0] for k in range(1, 13)]
    assert later[-1] < 4
