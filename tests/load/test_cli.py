"""`llmfleet load` as a user runs it: the real command against the real gateway (static
discovery) in front of two llm-d-inference-sim engines, and against nothing at all."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmfleet.autoscaler.sim.load.stats import DROPPED
from llmfleet.gateway.discovery import Pool, Service, StaticDiscovery
from tests.gateway.servers import ThreadServer, gateway, sims
from tests.net import free_port

LLMFLEET = Path(sys.executable).parent / "llmfleet"
MODEL = "load-model"
TTFT_MS, ITL_MS = 50, 5
"""The engines' simulated latencies: every TTFT the client sees is at least TTFT_MS."""

# Twelve Mooncake-style requests over 1.1 s; the first blocks repeat, as in the real trace.
ROWS: list[dict[str, Any]] = [
    {
        "timestamp": 100 * i,
        "input_length": 600 + 50 * i,
        "output_length": 4 + i,
        "hash_ids": [i % 3, 100 + i, 200 + i],
    }
    for i in range(12)
]


@pytest.fixture(scope="module")
def server(sim_binary: Path) -> Iterator[ThreadServer]:
    flags = ("--max-model-len", "8192", "--max-num-seqs", "32")
    latency = ("--time-to-first-token", f"{TTFT_MS}ms", "--inter-token-latency", f"{ITL_MS}ms")
    with sims(sim_binary, MODEL, 2, *flags, *latency) as engines:
        pool = Pool("unified", tuple(engine.url for engine in engines))
        service = Service(MODEL, "default", "svc", {"unified": pool})
        with gateway(StaticDiscovery({MODEL: service})) as running:
            yield running


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "slice.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return path


def llmfleet_load(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LLMFLEET_GATEWAY_URL", "KUBECONFIG")}
    return subprocess.run(
        [str(LLMFLEET), "load", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


def load_json(*args: str) -> tuple[int, dict[str, Any]]:
    done = llmfleet_load(*args, "--json")
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


def test_every_request_is_answered_with_measured_latencies(
    server: ThreadServer, trace: Path
) -> None:
    rc, result = load_json(
        "--trace", str(trace), "--gateway", server.url, "--speed", "2", "--seed", "1",
        "--ttft-slo-ms", "10000", "--itl-slo-ms", "1000",
    )  # fmt: skip
    assert rc == 0
    assert result["model"] == MODEL  # the first (only) model the gateway lists
    assert result["requests"] == {"planned": 12, "sent": 12, "ok": 12, "failed": 0, "dropped": 0}
    assert result["errors"] == {}
    # ignore_eos: the engines generated exactly the trace's output lengths...
    assert result["outputTokens"] == sum(row["output_length"] for row in ROWS)
    # ...and counted exactly its prompt lengths (one word, one dummy-tokenizer token).
    assert result["promptTokenRatio"] == 1.0
    ttft, itl = result["ttftMs"], result["itlMs"]
    assert TTFT_MS <= ttft["p50"] <= ttft["p95"] <= ttft["p99"] < 10_000
    assert 0 < itl["p50"] <= itl["p95"] <= itl["p99"] < 1000
    assert result["ttftAttainmentPct"] == result["itlAttainmentPct"] == 100.0
    assert result["sloSource"] == "options"
    # Open loop at twice the pace: the last request left at 0.55 s, not before.
    assert result["wallSeconds"] >= 1.1 / 2
    assert result["sendLagMs"]["p99"] < 500


def test_the_table_and_a_duration_cut(server: ThreadServer, trace: Path) -> None:
    done = llmfleet_load(
        "--trace", str(trace), "--gateway", server.url, "--model", MODEL, "--duration", "0.45"
    )
    assert done.returncode == 0, done.stderr
    # Not a terminal: one line on stderr to start with, the tables on stdout.
    assert f"load: 5 requests from {trace.name}" in done.stderr
    assert "TTFT" in done.stdout
    assert "ITL" in done.stdout
    assert "within SLO" not in done.stdout  # no target given: no attainment column
    assert f"{trace.name} x1 -> {server.url}, model {MODEL}: 5 requests in" in done.stdout
    # sent, ok, failed, dropped:
    assert re.search(r"│ +5 │ +5 │ +0 │ +0 │", done.stdout), done.stdout


def test_requests_beyond_the_cap_are_dropped_not_delayed(server: ThreadServer, trace: Path) -> None:
    # At 100x the twelve requests are due within 11 ms; each takes over 50 ms.
    rc, result = load_json(
        "--trace", str(trace), "--gateway", server.url, "--speed", "100", "--concurrency", "2"
    )  # fmt: skip
    assert rc == 0
    requests = result["requests"]
    assert requests["ok"] == requests["sent"] >= 2
    assert requests["dropped"] == 12 - requests["sent"] > 0
    assert result["errors"] == {DROPPED: requests["dropped"]}


def test_an_unknown_model_counts_the_gateways_error(server: ThreadServer, trace: Path) -> None:
    rc, result = load_json("--trace", str(trace), "--gateway", server.url, "--model", "nope")
    assert rc == 1  # not one answer
    assert result["requests"]["failed"] == 12
    assert result["errors"] == {"http 404 not_found_error": 12}


def test_a_dead_port_counts_connection_errors(trace: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    rc, result = load_json("--trace", str(trace), "--gateway", dead, "--model", MODEL)
    assert rc == 1
    assert result["requests"] == {"planned": 12, "sent": 12, "ok": 0, "failed": 12, "dropped": 0}
    assert result["errors"] == {"connection": 12}
    assert result["ttftMs"] is None


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        pytest.param(["--gateway", "DEAD"], "cannot list models at", id="no-gateway-no-model"),
        pytest.param(["--speed", "0"], "--speed must be above 0", id="zero-speed"),
        pytest.param(["--trace", "/nonexistent.jsonl"], "no such trace file", id="no-trace"),
    ],
)
def test_bad_input_is_one_line_and_exit_1(args: list[str], fragment: str, trace: Path) -> None:
    args = [f"http://127.0.0.1:{free_port()}" if a == "DEAD" else a for a in args]
    if "--trace" not in args:
        args = ["--trace", str(trace), *args]
    done = llmfleet_load(*args)
    assert done.returncode == 1
    assert fragment in done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
