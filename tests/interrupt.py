"""A test run stopped with SIGTERM tears down as after Ctrl-C.

Python's default SIGTERM handling ends the process at once, so a session fixture's `finally`
never runs: a system started with `llmfleet up --detach`, or a cluster, outlives the run (a CI
timeout or `kill` sends SIGTERM). Raising KeyboardInterrupt instead lets pytest stop the test,
run every fixture's teardown and report the run as interrupted.
"""

from __future__ import annotations

import signal
from types import FrameType


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def stop_on_sigterm() -> None:
    """Make SIGTERM interrupt the run as Ctrl-C does (call from `pytest_configure`)."""
    signal.signal(signal.SIGTERM, _interrupt)
