"""Our policy's fast pass in the simulator follows production (`promote.py`): a queue on the
serving engines promotes a loaded spare at once, one per look, and never a spare still loading.

The policy first sees a light steady load (one replica is enough by its model), then fast looks
with the gauges of the table's row."""

from __future__ import annotations

from dataclasses import replace

import pytest

from llmfleet.autoscaler.inputs import PolicyConfig
from llmfleet.autoscaler.sim.model import EngineModel
from llmfleet.autoscaler.sim.observe import Observation
from llmfleet.autoscaler.sim.ours import OurPolicy, service_spec
from llmfleet.autoscaler.sim.profile import engine_profile

MODEL = EngineModel().for_slo(50.0)
LIGHT = Observation(
    now=0.0, request_rate=1.0, prompt_tokens_rate=1000.0, mean_prompt_tokens=1000.0,
    mean_output_tokens=100.0, arrival_rate=1.0, arrival_prompt_tokens=1000.0,
    arrival_output_tokens=100.0, running=1.0, waiting=0.0, kv_cache_usage=0.01,
    ttft_p95_ms=None, itl_p95_ms=None, peak_prompt_tokens_rate=1000.0,
    active=1, spares=1, ready=1, starting=0, pods=(), ready_spares=1,
)  # fmt: skip


@pytest.mark.parametrize(
    ("gauges", "expected"),
    [
        pytest.param({"waiting": 2.0}, (2, 1), id="a-queue-promotes-the-loaded-spare"),
        pytest.param({"waiting": 0.0}, (1, 1), id="no-queue-holds"),
        pytest.param(
            {"waiting": 2.0, "ready_spares": 0, "starting": 1}, (1, 1),
            id="the-spare-still-loading-is-not-promoted",
        ),
    ],
)  # fmt: skip
def test_the_fast_look_promotes_a_spare_on_a_queue(
    gauges: dict[str, float], expected: tuple[int, int]
) -> None:
    policy = OurPolicy(
        service_spec(ttft_ms=2000, itl_ms=50, initial=1, max_replicas=8, warm_spares=1),
        engine_profile(MODEL),
        PolicyConfig(latency_quantile=0.99, horizon_s=MODEL.cold_start_s),
    )
    assert policy.decide(LIGHT) == (1, 1)

    assert policy.decide_fast(replace(LIGHT, now=5.0, **gauges)) == expected  # type: ignore[arg-type]
