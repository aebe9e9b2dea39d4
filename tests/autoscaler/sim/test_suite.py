"""The robustness suite's transformations (`sim/suite.py`) and `llmfleet sim --suite robust`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmfleet.autoscaler.sim import suite
from llmfleet.autoscaler.sim.cli import app
from llmfleet.autoscaler.sim.traces import Request, Trace

BASE = Trace(
    "base.jsonl",
    "mooncake",
    tuple(Request(float(t), 1000 + t, 10, (t % 3, 100 + t)) for t in range(0, 120)),
)
"""One request a second for two minutes, two prefix blocks each."""


def test_speed_divides_arrival_times() -> None:
    fast = suite.speed(BASE, 4.0)
    assert [r.arrival for r in fast.requests[:3]] == [0.0, 0.25, 0.5]
    assert fast.duration == pytest.approx(BASE.duration / 4)
    assert fast.name == "base.jsonl speed x4"


def test_prompts_scale_lengths_and_blocks_alike() -> None:
    double = suite.prompts(BASE, 2.0).requests[1]
    half = suite.prompts(BASE, 0.5).requests[1]
    assert (double.prompt_tokens, double.blocks) == (2002, (2, 3, 202, 203))
    assert (half.prompt_tokens, half.blocks) == (500, (1,))


def test_idle_then_the_busiest_minute() -> None:
    trace = Trace(
        "b.csv", "azure", (*BASE.requests, *(Request(200.0 + t / 10, 4000, 5) for t in range(50)))
    )
    made = suite.idle_then_busiest(trace)
    assert made.requests[0].arrival == 300.0  # five idle minutes, then the busiest minute
    assert made.requests[0].prompt_tokens == 4000
    assert len(made.requests) == 50


def test_a_step_quadruples_the_middle_third_only() -> None:
    made = suite.step(BASE)
    third = BASE.duration / 3
    inside = [r for r in made.requests if third <= r.arrival < 2 * third]
    original = [r for r in BASE.requests if third <= r.arrival < 2 * third]
    # The last request's copies spread towards the next arrival, past the third's end.
    assert 4 * len(original) - 3 <= len(inside) <= 4 * len(original)
    assert len(made.requests) == len(BASE.requests) + 3 * len(original)


def test_a_ramp_climbs_over_the_hour_with_fresh_blocks_per_repeat() -> None:
    made = suite.ramp(BASE)
    first, last = (
        sum(1 for r in made.requests if lo <= r.arrival < lo + 600) for lo in (0.0, 3000.0)
    )
    assert made.duration < 3600
    assert first < last / 4  # about 1/11 of the rate in the first ten minutes vs the last
    repeats = {r.blocks[0] >> 40 for r in made.requests}
    assert len(repeats) == 31  # 3,600 s of a 119 s trace: 31 repeats, each thinned


def test_light_is_a_tenth_of_the_requests_over_two_hours() -> None:
    made = suite.light(BASE)
    repeats = {r.blocks[0] >> 40 for r in made.requests}
    assert len(repeats) == 61  # 7,200 s of a 119 s trace: 61 repeats, each with its own blocks
    every = 61 * len(BASE.requests)
    assert 0.09 * every <= len(made.requests) <= 0.11 * every
    first, last = (
        sum(1 for r in made.requests if lo <= r.arrival < lo + 1800) for lo in (0.0, 5400.0)
    )
    assert abs(first - last) <= 0.25 * first  # light all along: no ramp
    assert made.name == "base.jsonl light x0.1 over 2 h"


def test_members_and_the_superimposed_pair() -> None:
    azure = Trace("a.csv", "azure", (Request(0.0, 100, 5), Request(1.0, 100, 5)))
    made = suite.members([BASE, azure], lambda a, b: "mooncake")
    names = [m.name for m in made]
    assert len(names) == 2 * 10 + 1
    last = made[-1]
    assert last.name == "base.jsonl + a.csv"
    assert last.slo_kind == "mooncake"
    assert len(last.trace.requests) == len(BASE.requests) + 2


def test_the_cli_runs_the_suite_with_a_summary(tmp_path: Path) -> None:
    path = tmp_path / "small.jsonl"
    lines = [
        json.dumps(
            {"timestamp": int(t * 500), "input_length": 2000, "output_length": 20, "hash_ids": [1]}
        )
        for t in range(240)
    ]
    path.write_text("\n".join(lines) + "\n")
    result = CliRunner().invoke(
        app, [str(path), "--suite", "robust", "-p", "llmfleet", "-p", "keda-inflight", "--quiet"]
    )
    assert result.exit_code == 0, result.output
    for name in (
        "speed x8",
        "prompts x0.5",
        "idle -> busiest",
        "step x4",
        "ramp over 1 h",
        "light x0.1 over 2 h",
    ):
        assert f"small.jsonl {name}" in result.output
    assert "Summary: llmfleet against the cheapest baseline" in result.output
    assert "llmfleet 1 spare" in result.output  # ours with 0 spares, and with 1 beside it


@pytest.mark.parametrize(("spares", "beside"), [(0, "llmfleet 1 spare"), (1, "llmfleet 0 spares")])
def test_the_suite_runs_ours_with_0_and_1_spares_side_by_side(
    tmp_path: Path, spares: int, beside: str
) -> None:
    path = tmp_path / "small.jsonl"
    lines = [
        json.dumps(
            {"timestamp": int(t * 500), "input_length": 2000, "output_length": 20, "hash_ids": [1]}
        )
        for t in range(120)
    ]
    path.write_text("\n".join(lines) + "\n")
    result = CliRunner().invoke(
        app,
        [str(path), "--suite", "robust", "-p", "llmfleet", "--warm-spares", str(spares),
         "--quiet", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    for member in document["traces"]:
        assert [p["policy"] for p in member["policies"]] == ["llmfleet", beside]
        # Ours beside ours is no baseline: with none run, no baseline meets the goal.
        assert "no baseline" in member["verdict"] or "NOT met" in member["verdict"]
    for row in document["summary"]:
        assert row["llmfleetBeside"]["policy"] == beside
        assert row["cheapestBaselineAtGoal"] is None


def test_an_unknown_suite_is_a_user_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["--suite", "fragile", "--quiet"])
    assert result.exit_code != 0
    assert "unknown suite 'fragile'" in str(result.exception)
