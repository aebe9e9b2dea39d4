"""`core.start_steps`: the process's start read from /proc, and each step's seconds from it, kept
from the first time the step is reached (the operator's and the autoscaler's
`*_start_seconds{step}`)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from prometheus_client import CollectorRegistry, Gauge

from llmfleet.core.start_steps import StartSteps, process_start

SLEEP_SECONDS = 0.6


@pytest.mark.skipif(sys.platform != "linux", reason="the process's start is read from /proc")
def test_the_process_start_counts_what_ran_before_the_module_was_imported() -> None:
    """A process that sleeps before it imports the module still counts the sleep: the start is
    the process's, not the import's (a wrong /proc field gives a figure far off either way)."""
    script = (
        f"import time; time.sleep({SLEEP_SECONDS})\n"
        "from llmfleet.core.start_steps import process_start\n"
        "print(time.monotonic() - process_start())\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, timeout=60).stdout  # fmt: skip
    age = float(out)
    assert SLEEP_SECONDS <= age < SLEEP_SECONDS + 20, age
    assert process_start() <= time.monotonic()


def test_each_step_is_set_once_at_its_first_time() -> None:
    registry = CollectorRegistry()
    gauge = Gauge("x_start_seconds", "steps", ["step"], registry=registry)
    steps = StartSteps(gauge)
    assert not steps.has_reached("listed")
    now = time.monotonic()
    steps.reached("listed", at=now)
    steps.reached("first_pass", at=now + 2.0)
    steps.reached("listed", at=now + 100)  # a later call changes nothing
    listed = registry.get_sample_value("x_start_seconds", {"step": "listed"})
    first_pass = registry.get_sample_value("x_start_seconds", {"step": "first_pass"})
    assert listed is not None
    assert first_pass is not None
    assert first_pass - listed == pytest.approx(2.0)
    assert steps.has_reached("listed")
    assert registry.get_sample_value("x_start_seconds", {"step": "serving"}) is None
