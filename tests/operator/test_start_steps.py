"""`llmfleet_operator_start_seconds`: what an operator's restart took, step by step, from its
process's start — serving, listed, first pass (`core.start_steps`, whose reading of the
process's start tests/unit/test_start_steps.py checks)."""

from __future__ import annotations

import time
from typing import cast

import pytest

from llmfleet.operator.handlers import note_start
from llmfleet.operator.metrics import OperatorMetrics
from llmfleet.operator.watched import Watched


def steps(metrics: OperatorMetrics) -> dict[str, float]:
    return {
        sample.labels["step"]: sample.value
        for family in metrics.registry.collect()
        if family.name == "llmfleet_operator_start_seconds"
        for sample in family.samples
    }


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
