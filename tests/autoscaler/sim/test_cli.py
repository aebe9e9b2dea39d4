"""`llmfleet sim` end to end: a small synthetic trace, the real traces (--json), bad input."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmfleet.autoscaler.sim import POLICIES
from llmfleet.autoscaler.sim.cli import app
from llmfleet.autoscaler.sim.compare import Options, compare
from llmfleet.autoscaler.sim.model import EngineModel
from llmfleet.autoscaler.sim.run import SimSettings, Slo
from llmfleet.autoscaler.sim.traces import TRACES_DIR_ENV, TraceError, load, shipped_dir
from llmfleet.core.errors import UserError

REPO = Path(__file__).resolve().parents[3]
runner = CliRunner()


def _synthetic(tmp_path: Path) -> Path:
    """Five minutes of Mooncake-style load: quiet, a 2-minute surge, quiet again."""
    path = tmp_path / "small.jsonl"
    lines = []
    t = 0.0
    while t < 300.0:
        rate = 6.0 if 90 <= t < 210 else 1.0
        block = int(t * 7) % 5
        lines.append(
            json.dumps(
                {
                    "timestamp": round(t * 1000),
                    "input_length": 3000,
                    "output_length": 40,
                    "hash_ids": [block, 100 + block, int(t * 1000)],
                }
            )
        )
        t += 1.0 / rate
    path.write_text("\n".join(lines) + "\n")
    return path


def test_every_policy_runs_a_small_trace_with_sane_figures(tmp_path: Path) -> None:
    trace = load(_synthetic(tmp_path))
    settings = SimSettings(slo=Slo(2000.0, 50.0), model=EngineModel().for_slo(50.0))
    comparison = compare(trace, settings, Options(warm_spares=1, max_replicas=16))
    assert [m.policy for m in comparison.metrics] == list(POLICIES)
    for m in comparison.metrics:
        assert 0.0 <= m.ttft_attainment <= 100.0
        assert 0.0 <= m.itl_attainment <= 100.0
        assert m.gpu_hours >= trace.duration / 3600 * 0.99  # at least one pod all along
        assert m.ttft_p95_ms <= m.ttft_p99_ms
        assert m.itl_p95_ms <= m.itl_p99_ms
    static = next(m for m in comparison.metrics if m.policy == "static-peak")
    assert static.meets_goal
    assert static.scale_events == 0
    ours = next(m for m in comparison.metrics if m.policy == "llmfleet")
    assert ours.scale_events > 0  # the surge is seen
    assert ours.prefix_hit_share > 0.3


def test_cli_table_states_the_slo(tmp_path: Path) -> None:
    result = runner.invoke(
        app, [str(_synthetic(tmp_path)), "--ttft-ms", "3000", "--itl-ms", "60", "--quiet"]
    )
    assert result.exit_code == 0, result.output
    assert "TTFT <= 3000 ms" in result.output
    assert "ITL (TPOT) <= 60 ms" in result.output
    for name in POLICIES:
        assert name in result.output


def test_plots_are_written(tmp_path: Path) -> None:
    out = tmp_path / "plots"
    result = runner.invoke(
        app,
        [str(_synthetic(tmp_path)), "-p", "llmfleet", "-p", "keda-inflight", "--plots", str(out)],
    )
    assert result.exit_code == 0, result.output
    (png,) = out.glob("*.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["-p", "hpa-cpu"], "unknown policy 'hpa-cpu'", id="unknown-policy"),
        pytest.param(["--ttft-ms", "0"], "impossible SLO: TTFT", id="zero-ttft"),
        pytest.param(["--ttft-ms", "20"], "below what an idle engine needs", id="ttft-too-low"),
        pytest.param(["--itl-ms", "1"], "impossible SLO: ITL", id="itl-too-low"),
    ],
)
def test_bad_input_is_a_user_error(tmp_path: Path, args: list[str], message: str) -> None:
    result = runner.invoke(app, [str(_synthetic(tmp_path)), "--quiet", *args])
    assert result.exit_code != 0
    assert isinstance(result.exception, UserError)
    assert message in str(result.exception)


def test_a_malformed_trace_line_is_a_user_error_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1}\n{oops\n')
    result = runner.invoke(app, [str(path), "--quiet"])
    assert isinstance(result.exception, UserError)
    assert f"{path}:2:" in str(result.exception)


def test_the_default_is_the_repositorys_trace_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TRACES_DIR_ENV, raising=False)
    assert shipped_dir() == REPO / "data" / "traces"
    assert {p.name for p in shipped_dir().iterdir()} >= {
        "azure2023_code.csv",
        "mooncake_synthetic.jsonl",
        "README.md",
    }


@pytest.mark.parametrize(
    ("make", "message"),
    [
        pytest.param(lambda tmp: tmp / "nowhere", "no such trace folder", id="missing-folder"),
        pytest.param(lambda tmp: tmp, "no .csv or .jsonl trace in the folder", id="empty-folder"),
    ],
)
def test_no_default_trace_is_an_error_not_an_empty_run(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    make: Callable[[Path], Path],
    message: str,
) -> None:
    folder = make(tmp_path)
    monkeypatch.setenv(TRACES_DIR_ENV, str(folder))
    result = runner.invoke(app, ["--quiet"])
    assert result.exit_code != 0
    assert isinstance(result.exception, TraceError)
    assert str(result.exception).startswith(f"{folder}: {message}")


def test_real_traces_json_ours_against_five_baselines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TRACES_DIR_ENV, raising=False)
    result = runner.invoke(app, ["--json", "--quiet"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert {t["kind"] for t in document["traces"]} == {"azure", "mooncake"}
    for trace in document["traces"]:
        rows = {row["policy"]: row for row in trace["policies"]}
        assert set(rows) == set(POLICIES)
        assert trace["slo"]["ttftMs"] > 0
        assert trace["slo"]["itlMs"] > 0
        for row in rows.values():
            assert 0 <= row["ttftAttainmentPct"] <= 100
            assert row["gpuHours"] >= 0.9 * trace["durationS"] / 3600
            assert math.isfinite(row["itlP95Ms"])
        assert rows["static-peak"]["meetsGoal"]
        assert rows["static-peak"]["scaleEvents"] == 0
        assert "verdict" in trace
        # The goal, with the CLI's defaults (a regression guard on the policy: the
        # replay is deterministic): fewer GPU-hours than every baseline meeting the goal.
        # Mooncake's margin is thin: 37 misses of 39 allowed.
        ours = rows["llmfleet"]
        assert ours["meetsGoal"], trace["verdict"]
        rivals = [p for p, r in rows.items() if r["meetsGoal"] and p != "llmfleet"]
        assert all(ours["gpuHours"] < rows[p]["gpuHours"] for p in rivals), trace["verdict"]
