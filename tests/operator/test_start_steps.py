"""`llmfleet_operator_start_seconds`: what an operator's restart took, step by step, from its
process's start (`metrics.process_start`, read from /proc) — serving, listed, first pass."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import cast

import pytest

from llmfleet.operator.handlers import note_start
from llmfleet.operator.metrics import OperatorMetrics, process_start
from llmfleet.operator.watched import Watched

SLEEP_SECONDS = 0.6


def steps(metrics: OperatorMetrics) -> dict[str, float]:
    return {
        sample.labels["step"]: sample.value
        for family in metrics.registry.collect()
        if family.name == "llmfleet_operator_start_seconds"
        for sample in family.samples
    }


@pytest.mark.skipif(sys.platform != "linux", reason="the process's start is read from /proc")
def test_the_process_start_counts_what_ran_before_the_module_was_imported() -> None:
    """A process that sleeps before it imports the module still counts the sleep: the start is
    the process's, not the import's (a wrong /proc field gives a figure far off either way)."""
    script = (
        f"import time; time.sleep({SLEEP_SECONDS})\n"
        "from llmfleet.operator.metrics import process_start\n"
        "print(time.monotonic() - process_start())\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, timeout=60).stdout  # fmt: skip
    age = float(out)
    assert SLEEP_SECONDS <= age < SLEEP_SECONDS + 20, age
    assert process_start() <= time.monotonic()


def test_a_step_keeps_its_first_time() -> None:
    metrics = OperatorMetrics()
    assert steps(metrics) == {}
    metrics.reached("serving")
    serving = steps(metrics)["serving"]
    assert serving >= 0.0
    metrics.reached("serving", at=time.monotonic() + 100)  # a later call changes nothing
    assert steps(metrics) == {"serving": serving}
    now = time.monotonic()
    metrics.reached("listed", at=now)
    metrics.reached("first_pass", at=now + 3.0)
    found = steps(metrics)
    assert found["first_pass"] - found["listed"] == pytest.approx(3.0)


class FakeWatched:
    def __init__(self) -> None:
        self.at: float | None = None

    def synced_at(self, kinds: list[object]) -> float | None:
        assert kinds, "the child kinds are asked for"
        return self.at


def test_a_pass_notes_the_first_pass_and_the_lists_once_they_are_in() -> None:
    metrics = OperatorMetrics()
    watched = FakeWatched()
    note_start(metrics, cast(Watched, watched))  # a pass that read no child: lists not known
    assert set(steps(metrics)) == {"first_pass"}
    first_pass = steps(metrics)["first_pass"]

    watched.at = time.monotonic() - 0.5
    note_start(metrics, cast(Watched, watched))
    after = steps(metrics)
    assert after["first_pass"] == first_pass
    assert after["listed"] < first_pass + 0.5
    watched.at = time.monotonic()
    note_start(metrics, cast(Watched, watched))
    assert steps(metrics)["listed"] == after["listed"]
