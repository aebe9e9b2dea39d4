"""The live view of `llmfleet up` / `llmfleet status --watch` (issue 30, item 4): it ends,
quietly and with exit status 0, when the system goes down under it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from llmfleet.core.local import commands, control, layout
from tests.net import free_port

GONE = ConnectionRefusedError(111, "Connection refused")


def _row(name: str) -> control.ServiceRow:
    return control.ServiceRow("default", name, "Unified", "True", 500.0, 50.0)


@pytest.mark.parametrize(
    ("takes", "alive", "shown"),
    [
        pytest.param(
            ["a", "b"], [True, True, False], [["a"], ["b"]],
            id="running-then-down-between-two-snapshots",
        ),
        pytest.param(
            ["a", GONE], [True, True, False], [["a"]],
            id="a-snapshot-failing-because-down-stopped-the-system-ends-the-view",
        ),
        pytest.param(
            ["a", GONE, "c"], [True, True, True, True, False],
            [["a"], ["a", "could not read the system: ConnectionRefusedError"], ["c"]],
            id="a-snapshot-failing-while-the-system-runs-is-a-problem-under-the-last-one",
        ),
        pytest.param(
            [GONE, "a"], [True, True, True, False],
            [["could not read the system: ConnectionRefusedError"], ["a"]],
            id="the-first-snapshot-failing-shows-an-empty-view-with-the-problem",
        ),
        pytest.param([], [False], [], id="down-before-the-first-snapshot"),
    ],
)  # fmt: skip
def test_the_live_view_follows_the_system_until_it_is_gone(
    takes: list[str | Exception], alive: list[bool], shown: list[list[str]]
) -> None:
    pending, checks = iter(takes), iter(alive)
    seen: list[list[str]] = []

    def take() -> control.Snapshot:
        item = next(pending)
        if isinstance(item, Exception):
            raise item
        return control.Snapshot(services=[_row(item)])

    def show(shot: control.Snapshot) -> None:
        problems = [p.split(" [Errno")[0].strip() for p in shot.problems]
        seen.append([row.service for row in shot.services] + problems)

    commands.follow(take, lambda: next(checks), show, lambda: None)

    assert seen == shown
    assert next(checks, None) is None, "the loop stopped before the system was gone"


@pytest.fixture
def supervisor() -> Iterator[subprocess.Popen[bytes]]:
    """A stand-in for the system's supervisor: a process whose end is `llmfleet down`."""
    process = subprocess.Popen(["sleep", "300"])
    try:
        yield process
    finally:
        process.kill()
        process.wait(10)


def test_status_watch_ends_with_status_0_when_the_system_goes_down(
    tmp_path: Path, supervisor: subprocess.Popen[bytes]
) -> None:
    # A record of a running system whose cluster does not answer (no kubeconfig): the view
    # shows the problem and goes on; the supervisor's end (what `llmfleet down` does) ends it.
    paths = layout.Paths(tmp_path / "system")
    paths.root.mkdir(parents=True)
    netns = layout.netns_of(supervisor.pid)
    assert netns is not None
    ports = layout.Ports(gateway=free_port(), prometheus=free_port(), api=free_port())
    layout.Record(supervisor.pid, netns, ports, time.time()).write(paths.record)
    # A terminal as rich sees one (TTY_COMPATIBLE, TTY_INTERACTIVE): each refresh is written.
    env = {
        **os.environ, "LLMFLEET_STATE_DIR": str(tmp_path), "COLUMNS": "200",
        "TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1",
    }  # fmt: skip
    screen, errors = tmp_path / "stdout", tmp_path / "stderr"
    with screen.open("wb") as stdout, errors.open("wb") as stderr:
        view = subprocess.Popen(
            [sys.executable, "-m", "llmfleet.core.cli", "status", "--watch"],
            env=env, stdout=stdout, stderr=stderr,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while "could not read the system" not in screen.read_text(errors="replace"):
            assert view.poll() is None, errors.read_text()
            assert time.monotonic() < deadline, "the view showed no snapshot within 60 s"
            time.sleep(0.2)
        supervisor.kill()
        supervisor.wait(10)
        view.wait(60)
    finally:
        view.kill()
    text = screen.read_text(errors="replace") + errors.read_text()
    assert view.returncode == 0, text
    assert "Traceback" not in text, text
    assert "the local system went down" in errors.read_text()


def _misses(requests: float, capacity: float, prompt: float) -> dict[str, Any]:
    return {
        "active": 1,
        "ttftMisses": {
            "boundMs": 500, "requests": requests, "capacity": capacity, "promptTooLong": prompt,
        },
    }  # fmt: skip


@pytest.mark.parametrize(
    ("pools", "line"),
    [
        pytest.param(
            {"unified": _misses(240, 0, 31)},
            "31 of 240 over 500 ms: 0 short of capacity, 31 prompt too long "
            "(would miss on an idle engine)",
            id="a-miss-no-scaling-fixes-reads-as-such",
        ),
        pytest.param(
            {"prefill": _misses(100, 4, 1), "decode": {"active": 2}},
            "5 of 100 over 500 ms: 4 short of capacity, 1 prompt too long "
            "(would miss on an idle engine)",
            id="disaggregated-the-prefill-pool-says",
        ),
        pytest.param({"unified": _misses(0, 0, 0)}, "", id="no-request-nothing"),
        pytest.param({"unified": {"active": 1}}, "", id="no-reading-nothing"),
    ],
)  # fmt: skip
def test_the_status_view_says_which_slo_misses_capacity_would_fix(
    pools: dict[str, Any], line: str
) -> None:
    assert control.ttft_misses(pools) == line
    row = control.ServiceRow("default", "chat", "Unified", "True", 500.0, 50.0, ttft_misses=line)
    console = Console(width=300, record=True)
    console.print(commands.render(control.Snapshot(services=[row])))
    shown = console.export_text()
    assert ("SLO misses by cause" in shown) == bool(line)
    assert line in shown
