"""Baselines' rules on short timelines of observations."""

from __future__ import annotations

from dataclasses import replace

import pytest

from llmfleet.autoscaler.sim.baselines import (
    AibrixKpa,
    DynamoPlanner,
    DynamoProfile,
    KedaInflight,
)
from llmfleet.autoscaler.sim.hpa import Behaviour, Policy
from llmfleet.autoscaler.sim.model import EngineModel
from llmfleet.autoscaler.sim.observe import Observation, PodView
from llmfleet.autoscaler.sim.wva import LlmdWva

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
    ("running", "waiting", "active", "expected"),
    [
        pytest.param(20.0, 10.0, 2, 6, id="30-in-flight-asks-10-hpa-allows-4-pods-per-15-s"),
        pytest.param(6.0, 0.5, 2, 2, id="within-hpa-tolerance"),
        pytest.param(12.0, 3.0, 4, 5, id="15-in-flight-over-3-is-5"),
    ],
)
def test_keda_scales_to_in_flight_over_target(
    running: float, waiting: float, active: int, expected: int
) -> None:
    keda = KedaInflight(active, target=3.0)
    assert keda.decide(at(15.0, running=running, waiting=waiting, active=active)) == (expected, 0)


def test_keda_scales_down_only_after_the_hpa_300_s_stabilisation() -> None:
    keda = KedaInflight(1, target=3.0)
    assert keda.decide(at(15.0, running=12.0, active=1))[0] == 4
    timeline = [keda.decide(at(15.0 * k, running=1.0, active=4))[0] for k in range(2, 22)]
    assert timeline[:19] == [4] * 19  # 30 s .. 300 s: the 4 of 15 s is in the window
    assert timeline[19] == 1


MODEL = EngineModel().for_slo(50.0)
PROMPT, OUTPUT = 2000.0, 50.0
DERIVED = min(512 * OUTPUT / (PROMPT + OUTPUT), 444) * (PROMPT + OUTPUT / 2)
"""WVA's k2 for this engine (batched-token budget 512, 444 sequences) and load: ~25,288 tokens."""
INSTANT = Behaviour(0.0, (Policy("Pods", 100, 15),), 0.0, (Policy("Pods", 100, 15),))
"""An HPA that follows WVA's desired replicas at once (to read the analyzer alone)."""


def wva_at(t: float, pods: list[tuple[float, int]], *, active: int, ready: int) -> Observation:
    views = tuple(PodView(waiting=w, running=0, kv_usage=kv) for kv, w in pods)
    return at(
        t,
        active=active,
        ready=ready,
        mean_prompt_tokens=PROMPT,
        mean_output_tokens=OUTPUT,
        pods=views,  # type: ignore[arg-type]
    )


def test_wva_derives_k2_from_the_engine_budget() -> None:
    assert MODEL.max_batched_tokens == 512
    assert MODEL.max_num_seqs == 444
    assert round(DERIVED) == 25288


@pytest.mark.parametrize(
    ("boundary", "expected"),
    [
        # 3 pods of 25,288 tokens hold 4,209 tokens each: demand 12,627.
        pytest.param(0.15, 3, id="12627/0.15-needs-all-3"),
        pytest.param(0.3, 2, id="12627/0.3-fits-in-2"),
        pytest.param(0.7, 1, id="12627/0.7-fits-in-1"),
    ],
)
def test_wva_scales_down_only_as_far_as_the_load_projected_onto_fewer_pods_fits(
    boundary: float, expected: int
) -> None:
    wva = LlmdWva(3, MODEL, scale_down=boundary, hpa=INSTANT)
    observation = wva_at(60.0, [(0.01, 0)] * 3, active=3, ready=3)
    assert wva.decide(observation)[0] == expected


def test_wva_scales_up_by_the_missing_capacity_counting_pending_pods() -> None:
    # Queues at 10 >= 5: k2 is observed, the tokens in use (0.05 x 420,904 = 21,045); demand =
    # 2 x (21,045 + 10 x 2,000) = 82,090; /0.85 = 96,576.
    saturated = [(0.05, 10)] * 2
    two = LlmdWva(2, MODEL, scale_up=0.85, hpa=INSTANT)
    assert two.decide(wva_at(60.0, saturated, active=2, ready=2))[0] == 5  # +ceil(54,486/21,045)
    three = LlmdWva(3, MODEL, scale_up=0.85, hpa=INSTANT)
    assert three.decide(wva_at(60.0, saturated, active=3, ready=2))[0] == 5  # one is pending


def test_wva_remembers_the_observed_k2_once_the_queue_is_gone() -> None:
    # 5 calm pods at 0.021 x 420,904 = 8,839 tokens: demand 44,195, / 0.5 = 88,390. With the
    # derived 25,288 a pod, 5 x 25,288 - 88,390 leaves room to drop one; with the 21,045
    # observed under a queue a minute earlier, it does not.
    calm = [(0.021, 0)] * 5
    fresh = LlmdWva(5, MODEL, scale_down=0.5, hpa=INSTANT)
    assert fresh.decide(wva_at(60.0, calm, active=5, ready=5))[0] == 4
    learnt = LlmdWva(2, MODEL, scale_down=0.5, hpa=INSTANT)
    learnt.decide(wva_at(60.0, [(0.05, 10)] * 2, active=2, ready=2))
    assert learnt.decide(wva_at(120.0, calm, active=5, ready=5))[0] == 5


def test_wva_acts_every_minute_through_its_hpa_240_s_stabilisation() -> None:
    wva = LlmdWva(2, MODEL, scale_up=0.85)
    saturated = [(0.05, 10)] * 2
    timeline = [wva.decide(wva_at(15.0 * k, saturated, active=2, ready=2))[0] for k in range(1, 21)]
    assert timeline[:18] == [2] * 18  # WVA asks 5 from 60 s; the HPA keeps the 2 of 15-45 s
    assert timeline[18] == 5  # 285 s: the last 2 (45 s) has left the 240 s window


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
