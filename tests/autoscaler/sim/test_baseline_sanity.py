"""Each baseline on a steady load, started one replica over the oracle: it must settle within one
replica of the static oracle (the smallest fixed fleet meeting the goal), or the comparison
measures a misconfigured baseline rather than the policy.

Every baseline here carries some model of headroom: our policy and Dynamo a measured profile,
AIBrix and KEDA a target concurrency per replica, llm-d's WVA a token capacity per replica and a
scale-down that must fit the load into the replicas that remain. (KEDA on the queue alone and an
SLO-ratio rule had none: an empty queue and a flat latency look the same at two replicas and at
ten, so both stepped down into saturation and back up, whatever their thresholds; they were
replaced by the systems' documented ways to size a fleet, `sim/baselines.py`.)

The load: 12 requests/s of 2,000-token prompts and 50-token answers, evenly spaced, for ten
minutes (the oracle needs 2 replicas); judged on the serving pods over the last four minutes.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from llmfleet.autoscaler.inputs import PolicyConfig
from llmfleet.autoscaler.sim.baselines import (
    AibrixKpa,
    DynamoPlanner,
    DynamoProfile,
    KedaInflight,
)
from llmfleet.autoscaler.sim.compare import Options, compare
from llmfleet.autoscaler.sim.controller import Controller
from llmfleet.autoscaler.sim.model import EngineModel
from llmfleet.autoscaler.sim.ours import OurPolicy, service_spec
from llmfleet.autoscaler.sim.profile import engine_profile
from llmfleet.autoscaler.sim.run import SimSettings, Slo, simulate
from llmfleet.autoscaler.sim.traces import Request, Trace
from llmfleet.autoscaler.sim.wva import LlmdWva

MODEL = EngineModel().for_slo(50.0)
SETTINGS = SimSettings(slo=Slo(2000.0, 50.0), model=MODEL)
TRACE = Trace("steady.csv", "azure", tuple(Request(i / 12, 2000, 50) for i in range(12 * 600)))
STATIC = 2

FACTORIES: dict[str, Callable[[], Controller]] = {
    "llmfleet": lambda: OurPolicy(
        service_spec(ttft_ms=2000, itl_ms=50, initial=3, max_replicas=64, warm_spares=0),
        engine_profile(MODEL),
        PolicyConfig(latency_quantile=0.99, horizon_s=MODEL.cold_start_s),
    ),
    "dynamo-planner": lambda: DynamoPlanner(3, DynamoProfile(MODEL), itl_ms=50),
    "aibrix-kpa": lambda: AibrixKpa(3),
    "keda-inflight": lambda: KedaInflight(3),
    "llm-d-wva": lambda: LlmdWva(3, MODEL),
}


def _settled(controller: Controller) -> tuple[int, int]:
    run = simulate(TRACE, controller, SETTINGS)
    tail = [p.serving for p in run.timeline if p.t >= 360]
    return min(tail), max(tail)


def test_the_oracle_needs_two() -> None:
    comparison = compare(TRACE, SETTINGS, Options(0, 1, 64), ["static-peak"])
    assert comparison.static_replicas == STATIC


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_a_baseline_settles_within_one_replica_of_the_oracle(name: str) -> None:
    low, high = _settled(FACTORIES[name]())
    assert STATIC - 1 <= low <= high <= STATIC + 1, (name, low, high)
