"""What a new user does first: the commands `llmfleet up` prints, then `llmfleet load` on a public
trace and `llmfleet status`."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from e2e.system import LocalSystem, wait_for

pytestmark = pytest.mark.e2e

TRACE = Path(__file__).resolve().parents[1] / "data" / "traces" / "azure2023_code.csv"


def printed(system: LocalSystem, prefix: str) -> str:
    lines = [line for line in system.up_output.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, f"`llmfleet up` printed no single {prefix!r} line:\n{system.up_output}"
    return lines[0]


@pytest.mark.parametrize("prefix", ["curl ", "OPENAI_BASE_URL="])
def test_the_printed_first_request_works_as_printed(system: LocalSystem, prefix: str) -> None:
    """Run exactly what `llmfleet up` printed, in a shell with a bare environment (no virtualenv
    active): it gets an answer from an engine behind a pod."""
    command = printed(system, prefix)
    done = subprocess.run(
        ["bash", "-c", command],
        env={"PATH": "/usr/local/bin:/usr/bin:/bin"},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    answer = done.stdout.strip()
    assert answer
    if prefix == "curl ":
        assert json.loads(answer)["choices"][0]["message"]["content"]


def test_load_on_a_public_trace_shows_in_status(system: LocalSystem) -> None:
    """`llmfleet load` replays the Azure trace against the gateway; `llmfleet status` then shows
    the traffic, its latency and the autoscaler's reason for the pool's size."""
    load = system.llmfleet(
        "load", "--trace", str(TRACE), "--model", "qwen-7b", "--duration", "20",
        "--gateway", system.gateway, "--json", "--quiet",
        timeout=240,
    )  # fmt: skip
    assert load.returncode == 0, (load.stderr[-2000:], load.stdout[-3000:])
    report = json.loads(load.stdout)
    print(f"LOAD: {json.dumps(report)[:600]}")
    status = system.llmfleet("status", "--json", timeout=60)
    assert status.returncode == 0, status.stderr
    shot = json.loads(status.stdout)
    chat = next(row for row in shot["services"] if row["service"] == "chat")
    assert chat["rps"] is not None
    assert chat["rps"] > 0
    assert chat["ttft_p95_ms"] is not None
    pool = next(row for row in shot["pools"] if row["service"] == "chat")
    assert pool["decision"], shot


def test_the_local_prometheus_evaluates_the_charts_rules(system: LocalSystem) -> None:
    """The chart's recording rules and alerts load into the local Prometheus, every rule
    evaluates without error, and after the load above the per-service TTFT p95 the dashboards
    read has a value for `chat`."""
    answer = system.http.get(f"{system.prometheus}/api/v1/rules")
    answer.raise_for_status()
    groups = answer.json()["data"]["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert {"recording", "alerting"} <= {rule["type"] for rule in rules}

    def not_ok() -> list[str]:
        listed = system.http.get(f"{system.prometheus}/api/v1/rules").json()["data"]["groups"]
        return [f"{r['name']}: {r.get('health')} {r.get('lastError', '')}".strip()
                for g in listed for r in g["rules"] if r.get("health") != "ok"]  # fmt: skip

    # A rule's health is "unknown" until its group's first evaluation, which Prometheus spreads
    # over the group's interval (the SLO burn-rate group evaluates every minute): wait two
    # intervals of the slowest group, and name what is still not "ok" when that runs out.
    slowest = max(float(group.get("interval", 0)) for group in groups)
    deadline = time.monotonic() + 2 * slowest + 30
    while (pending := not_ok()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not pending, f"rules not evaluated without error: {pending}"
    series = wait_for(
        lambda: system.query('llmfleet_service:ttft_seconds:p95_rate5m{service="chat"}') or None,
        60,
        "the chat service's TTFT p95 recording rule",
    )
    assert float(series[0]["value"][1]) > 0
