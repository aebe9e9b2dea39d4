"""MetricsMissing (issue 27, item 3): an autoscaled service says so once the autoscaler has
found no engine series for a pool with Ready pods for `metrics_missing_seconds`, names the
pools and what to check, and posts a Warning when it turns True."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from llmfleet.crds import Condition
from llmfleet.crds.inference_service import AutoscalingStatus, ConditionStatus
from llmfleet.operator.observed import Observed, ObservedPod
from llmfleet.operator.plan import desired
from llmfleet.operator.pools import COST_SERVING, COST_SPARE
from llmfleet.operator.settings import OperatorSettings
from tests.operator.test_plan import load

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
SETTINGS = OperatorSettings(metrics_missing_seconds=300)


def since(seconds_ago: float) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).isoformat().replace("+00:00", "Z")


def observed(seconds_ago: float | None, conditions: tuple[Condition, ...] = ()) -> Observed:
    status = AutoscalingStatus(
        metrics_missing_since=None if seconds_ago is None else since(seconds_ago),
        metrics_missing_pools=None if seconds_ago is None else ["unified"],
    )
    return Observed(autoscaling=status, conditions=conditions)


def condition(sample: str, seen: Observed) -> Condition | None:
    plan = desired(load(sample), seen, SETTINGS, NOW)
    wire: list[dict[str, str]] = plan.status["conditions"]  # type: ignore[assignment]
    found = [Condition.model_validate(c) for c in wire if c["type"] == "MetricsMissing"]
    return found[0] if found else None


@pytest.mark.parametrize(
    ("seconds_ago", "status", "reason"),
    [
        (None, "False", "SeriesArrive"),
        (60, "False", "SeriesArrive"),
        (299, "False", "SeriesArrive"),
        (300, "True", "NoEngineSeries"),
        (3600, "True", "NoEngineSeries"),
    ],
    ids=["series arrive", "missing 1 min", "just under 5 min", "5 min", "an hour"],
)
def test_metrics_missing_after_the_documented_time(
    seconds_ago: float | None, status: str, reason: str
) -> None:
    found = condition("spares", observed(seconds_ago))
    assert found is not None
    assert (found.status.value, found.reason) == (status, reason)
    if status == "True":
        assert "unified" in found.message
        assert "serviceMonitors.labels" in found.message


def test_a_service_without_autoscaling_has_no_such_condition() -> None:
    assert condition("unified", observed(3600)) is None


def test_turning_true_posts_a_warning() -> None:
    before = Condition(type="MetricsMissing", status=ConditionStatus.FALSE, reason="SeriesArrive",
                       last_transition_time=since(900))  # fmt: skip
    plan = desired(load("spares"), observed(600, (before,)), SETTINGS, NOW)
    [event] = [e for e in plan.events if e.reason == "NoEngineSeries"]
    assert event.warning
    assert event.message.startswith("MetricsMissing=True")


@pytest.mark.parametrize(
    ("after", "seconds_ago", "lasted"),
    [
        (3, 5, "for 5 seconds (since"),
        (60, 119, "for 119 seconds (since"),
        (60, 120, "for 2 minutes (since"),
        (300, 3600, "for 60 minutes (since"),
    ],
)
def test_the_message_says_how_long_in_words_a_person_reads(
    after: float, seconds_ago: float, lasted: str
) -> None:
    """A short METRICS_MISSING_SECONDS (the live test's 3 s) reads in seconds, not "0 minutes"."""
    plan = desired(load("spares"), observed(seconds_ago),
                   OperatorSettings(metrics_missing_seconds=after), NOW)  # fmt: skip
    wire: list[dict[str, str]] = plan.status["conditions"]  # type: ignore[assignment]
    found = next(c for c in wire if c["type"] == "MetricsMissing")
    assert found["status"] == "True"
    assert lasted in found["message"]


def settled(seconds_ago: float | None) -> Observed:
    """The spares sample with its serving pod and its spare Ready: nothing else to wait for."""
    pods = (
        ObservedPod(name="p0", pool="unified", created=NOW, ready=True, serving=True,
                    deletion_cost=COST_SERVING),
        ObservedPod(name="p1", pool="unified", created=NOW, ready=True, serving=False,
                    deletion_cost=COST_SPARE),
    )  # fmt: skip
    return dataclasses.replace(observed(seconds_ago), pods=pods)


@pytest.mark.parametrize(
    ("seconds_ago", "requeue"),
    [(None, None), (60, 240.0), (299, 1.0), (300, None), (3600, None)],
    ids=["series arrive", "missing 1 min", "just under 5 min", "True already", "an hour"],
)
def test_a_settled_service_looks_again_when_metrics_missing_turns_true(
    seconds_ago: float | None, requeue: float | None
) -> None:
    """Nothing wakes the service when `metricsMissingSince` ages past the limit (the autoscaler
    wrote it once): the pass asks to look again then, not at the next resync."""
    plan = desired(load("spares"), settled(seconds_ago), SETTINGS, NOW)
    assert plan.requeue_after == requeue
