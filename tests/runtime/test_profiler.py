"""The profiler recovers the latencies a simulator was configured with, within 20%."""

from __future__ import annotations

import io
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from rich.console import Console

from llmfleet.core.capacity_profile import CapacityProfile
from llmfleet.runtime.errors import ExitCode
from llmfleet.runtime.profiler import ProfileSettings, fit_line, percentile, run_profile
from tests.runtime.processes import LAUNCHER, running_sim

TOLERANCE = 0.2


@dataclass(frozen=True)
class SimCase:
    id: str
    flags: tuple[str, ...]
    ttft_ms: dict[int, float]
    """Expected TTFT per prompt length the profiler measures."""
    itl_ms: float
    max_num_seqs: int
    prefill_tok_s: float | None
    """None: TTFT does not depend on the prompt, so no rate can be measured."""


SIM_CASES = [
    SimCase(
        "constant-ttft-100ms-itl-20ms",
        ("--time-to-first-token", "100ms", "--inter-token-latency", "20ms", "--max-num-seqs", "8"),
        {16: 100, 256: 100},
        20,
        8,
        None,
    ),
    SimCase(
        # TTFT = overhead + per-token time x prompt tokens (time-to-first-token must be 0).
        "per-token-prefill-itl-40ms",
        ("--prefill-overhead", "30ms", "--prefill-time-per-token", "500us",
         "--inter-token-latency", "40ms", "--max-num-seqs", "5"),
        {64: 30 + 0.5 * 64, 512: 30 + 0.5 * 512},
        40,
        5,
        1000 / 0.5,
    ),
]  # fmt: skip


def _near(measured: float, expected: float) -> bool:
    return abs(measured - expected) <= TOLERANCE * expected


@pytest.mark.parametrize("case", SIM_CASES, ids=[case.id for case in SIM_CASES])
def test_profile_recovers_configured_latencies(
    sim_binary: Path, tmp_path: Path, case: SimCase
) -> None:
    with running_sim(sim_binary, "sim-model", *case.flags) as url:
        settings = ProfileSettings(
            url=url,
            prompt_lengths=sorted(case.ttft_ms),
            concurrencies=[1, 4],
            output_tokens=12,
            repeats=2,
            max_concurrency=32,
        )
        profile = run_profile(settings, Console(file=io.StringIO()))
    assert profile.model == "sim-model"
    for point in profile.ttft:
        expected = case.ttft_ms[point.requested_tokens]
        assert _near(point.p50_ms, expected), f"TTFT {point.p50_ms:.1f} ms vs {expected} ms"
    for itl in profile.itl:
        assert _near(itl.p50_ms, case.itl_ms), f"ITL {itl.p50_ms:.1f} ms vs {case.itl_ms} ms"
    assert profile.max_concurrency.value == case.max_num_seqs
    assert profile.max_concurrency.limited_by == "queueing"
    if case.prefill_tok_s is None:
        assert profile.prefill_tokens_per_second is None
    else:
        assert profile.prefill_tokens_per_second is not None
        assert _near(profile.prefill_tokens_per_second, case.prefill_tok_s)
    # The simulator's default KV cache: --kv-cache-size 1024 blocks x --block-size 16.
    assert profile.kv_cache_tokens == 1024 * 16
    (tmp_path / "profile.json").write_text(profile.model_dump_json(by_alias=True))


def test_prefill_rate_is_recovered_from_the_ttft_slope(sim_binary: Path) -> None:
    flags = ("--prefill-overhead", "20ms", "--prefill-time-per-token", "1ms", "--max-num-seqs", "4")
    with running_sim(sim_binary, "m", *flags) as url:
        settings = ProfileSettings(
            url=url, prompt_lengths=[32, 256], concurrencies=[1], output_tokens=4, repeats=2,
            max_concurrency=4,
        )  # fmt: skip
        profile = run_profile(settings, Console(file=io.StringIO()))
    assert profile.ttft_fit is not None
    assert _near(profile.ttft_fit.ms_per_prompt_token, 1.0)
    assert profile.prefill_tokens_per_second is not None
    assert _near(profile.prefill_tokens_per_second, 1000)
    assert profile.max_concurrency.limited_by == "search-limit"


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        pytest.param([5.0], 95, 5.0, id="single"),
        pytest.param([1.0, 2.0, 3.0, 4.0], 50, 2.0, id="median-nearest-rank"),
        pytest.param([float(v) for v in range(1, 101)], 95, 95.0, id="p95-of-100"),
    ],
)
def test_percentile(values: list[float], q: float, expected: float) -> None:
    assert percentile(values, q) == expected


def test_fit_line_needs_two_lengths() -> None:
    assert fit_line([(10, 5.0), (10, 6.0)]) is None
    intercept, slope = fit_line([(0, 1.0), (10, 21.0)]) or (0.0, 0.0)
    assert (intercept, slope) == pytest.approx((1.0, 2.0))


def test_profile_command_writes_the_profile(sim_binary: Path, tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    with running_sim(sim_binary, "m", "--inter-token-latency", "5ms", "--max-num-seqs", "2") as url:
        result = subprocess.run(
            [LAUNCHER, "profile", "--url", url, "--out", out, "--prompt-lengths", "16,64",
             "--concurrency", "1,2", "--repeats", "1", "--output-tokens", "4",
             "--max-concurrency", "4"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    profile = CapacityProfile.model_validate_json(out.read_text())
    assert profile.schema_version == 1
    assert [p.requested_tokens for p in profile.ttft] == [16, 64]
    assert [p.concurrency for p in profile.itl] == [1, 2]
    assert profile.max_concurrency.value == 2


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        pytest.param(["--url", "http://127.0.0.1:9"], ExitCode.PROFILE_FAILED,
                     "profiling http://127.0.0.1:9 failed: ConnectError", id="unreachable"),
        pytest.param(["--url", "http://127.0.0.1:9", "--model", "m"], ExitCode.PROFILE_FAILED,
                     "failed: ConnectError", id="unreachable-with-model"),
        pytest.param(["--url", "http://127.0.0.1:9", "--concurrency", "1,x"], ExitCode.USAGE,
                     "--concurrency takes integers", id="bad-levels"),
    ],
)  # fmt: skip
def test_profile_command_errors(
    tmp_path: Path, args: list[str], code: ExitCode, words: str
) -> None:
    result = subprocess.run(
        [LAUNCHER, "profile", "--out", tmp_path / "p.json", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == code
    # The progress bar may have drawn itself first; the error is the last line, and one line.
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("llmfleet-runtime: error: ")
    assert words in last
    assert not (tmp_path / "p.json").exists()
