"""The report's figures mean what they say: load steps and the time to their capacity, the
prefix-cache upper bound, percentiles over requests that never finished (no numpy warning:
pytest turns warnings into errors)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llmfleet.autoscaler.sim.compare import Options, compare, metrics
from llmfleet.autoscaler.sim.model import EngineModel
from llmfleet.autoscaler.sim.report import title
from llmfleet.autoscaler.sim.run import RunResult, SimSettings, Slo
from llmfleet.autoscaler.sim.steps import Step, largest_step, time_to_capacity
from llmfleet.autoscaler.sim.traces import Request, Trace, prefix_upper_bound

STARTS = [15.0 * i for i in range(8)]


@pytest.mark.parametrize(
    ("needs", "expected"),
    [
        pytest.param([2, 2, 2, 2, 2, 2, 2, 2], None, id="steady-no-step"),
        pytest.param([5, 4, 3, 2, 2, 2, 2, 2], None, id="highest-at-the-start-no-step"),
        pytest.param([1, 1, 4, 4, 2, 6, 6, 1], Step(30.0, 4, 1), id="largest-rise"),
        pytest.param([1, 1, 2, 2, 1, 6, 6, 1], Step(75.0, 6, 2), id="rise-over-the-lookbacks-max"),
    ],
)
def test_largest_step(needs: list[int], expected: Step | None) -> None:
    assert largest_step(STARTS, needs, 15.0) == expected


def test_a_step_is_measured_against_the_lookback_only() -> None:
    # 6 at 0 s is forgotten after 30 s (lookback 30 s): 6 at 60 s rises from 1.
    assert largest_step(STARTS, [6, 1, 1, 1, 6, 1, 1, 1], 15.0, lookback_s=30.0) == Step(60.0, 6, 1)


STEP = Step(100.0, 4, 2)


@pytest.mark.parametrize(
    ("log", "expected"),
    [
        pytest.param([(0.0, 4)], 0.0, id="already-serving-enough"),
        pytest.param([(0.0, 2), (102.0, 4)], 2.0, id="a-spare-promoted"),
        pytest.param([(0.0, 2), (150.0, 3), (192.5, 4)], 92.5, id="two-cold-starts"),
        pytest.param([(0.0, 2), (150.0, 3)], None, id="never-enough"),
        pytest.param([(0.0, 2), (800.0, 4)], None, id="beyond-the-horizon"),
        pytest.param([(0.0, 4), (90.0, 2), (120.0, 5)], 20.0, id="scaled-down-before-the-step"),
    ],
)
def test_time_to_capacity(log: list[tuple[float, int]], expected: float | None) -> None:
    assert time_to_capacity(log, STEP) == expected


def test_prefix_upper_bound_counts_leading_blocks_seen_before() -> None:
    trace = Trace(
        "t",
        "mooncake",
        (
            Request(0.0, 1024, 1, (1, 2)),  # nothing seen: 0
            Request(1.0, 1024, 1, (1, 2)),  # both blocks seen, one token computed: 1023
            Request(2.0, 1536, 1, (1, 3, 2)),  # 1 seen, 3 not: the run stops: 512
            Request(3.0, 512, 1, (9,)),  # new: 0
        ),
        block_tokens=512,
    )
    assert prefix_upper_bound(trace) == pytest.approx((1023 + 512) / (1024 + 1024 + 1536 + 512))
    assert prefix_upper_bound(Trace("a", "azure", (Request(0.0, 10, 1),))) == 0.0


def test_requests_that_never_finish_are_inf_without_a_numpy_warning() -> None:
    ttft = np.array([0.1] * 97 + [math.inf] * 3)
    run = RunResult(
        policy="p",
        ttft_s=ttft,
        tpot_s=np.array([0.01] * 97 + [math.inf] * 3),
        itl_values=np.array([0.01]),
        itl_weights=np.array([1.0]),
        gpu_hours=1.0,
        scale_events=0,
        pods_created=1,
        preemptions=0,
        prefix_hit_share=0.0,
        timeline=[],
        serving_log=[(0.0, 1)],
        wall_s=0.0,
    )
    m = metrics(run, SimSettings(slo=Slo(1000.0, 50.0)), None)
    assert m.ttft_p95_ms == pytest.approx(100.0)
    assert m.ttft_p99_ms == math.inf
    assert m.ttft_attainment == pytest.approx(97.0)
    assert m.time_to_capacity_s is None


def test_the_title_names_the_requests_no_fleet_serves_in_time() -> None:
    # One of four prompts takes longer than the 2 s target on an idle engine (its prefill alone
    # is seconds long): 25% out of reach, whatever the fleet; none when every prompt fits.
    model = EngineModel().for_slo(50.0)
    huge = next(n for n in range(50_000, 2_000_000, 50_000) if model.lone_ttft_s(n) > 2.0)
    settings = SimSettings(slo=Slo(2000.0, 50.0), model=model)
    requests = [Request(i, 500, 10) for i in range(3)]
    mixed = Trace("t.csv", "azure", (*requests, Request(3.0, huge, 10)))
    small = Trace("s.csv", "azure", tuple(Request(i, 500, 10) for i in range(4)))

    out = title(compare(mixed, settings, Options(0, 1, 4), ["static-peak"]))
    fits = title(compare(small, settings, Options(0, 1, 4), ["static-peak"]))

    assert "25.00% of requests take longer than the TTFT target on an idle engine" in out
    assert "on an idle engine" not in fits
