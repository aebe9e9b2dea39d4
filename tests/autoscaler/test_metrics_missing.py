"""The autoscaler says when Prometheus has no engine series for a pool whose pods are Ready
(issue 27, item 3): `status.autoscaling.metricsMissingSince` from the first full pass in a row
that found none, cleared when they come back; the operator turns it into MetricsMissing."""

from __future__ import annotations

from typing import Any

from tests.autoscaler.builders import at, signals
from tests.autoscaler.test_actuation import RecordingKube, Signals, autoscaler, body, serving


def missing(kube: RecordingKube) -> tuple[Any, Any]:
    status = kube.body["status"]["autoscaling"]
    return status.get("metricsMissingSince"), status.get("metricsMissingPools")


def test_missing_series_are_dated_from_the_first_pass_and_cleared_when_they_come() -> None:
    kube, source = RecordingKube(body(), serving(2)), Signals()
    scaler = autoscaler(kube, source, status_refresh_seconds=3600)
    scaler.run_once(at(0))  # Ready pods, no series at all
    assert missing(kube) == ("2026-01-01T00:00:00Z", ["unified"])
    scaler.run_once(at(15))
    assert missing(kube) == ("2026-01-01T00:00:00Z", ["unified"])  # the first pass stays
    source.by_pool["unified"] = signals(1.0, seconds=30)
    scaler.run_once(at(30))
    assert missing(kube) == (None, None)
    assert kube.writes[-1]["metricsMissingSince"] is None  # the merge patch removes it


def test_pools_without_ready_pods_have_nothing_to_be_missing() -> None:
    kube, source = RecordingKube(body(), []), Signals()
    autoscaler(kube, source).run_once(at(0))
    assert missing(kube) == (None, None)


def test_prometheus_down_counts_as_missing() -> None:
    kube, source = RecordingKube(body(), serving(1)), Signals()
    source.down = True
    autoscaler(kube, source).run_once(at(0))
    assert missing(kube) == ("2026-01-01T00:00:00Z", ["unified"])


def test_a_fast_pass_keeps_what_the_full_pass_found() -> None:
    kube, source = RecordingKube(body(), serving(1)), Signals()
    scaler = autoscaler(kube, source, status_refresh_seconds=0)
    scaler.run_once(at(0))
    source.gauges["unified"] = signals(1.0, seconds=5)
    scaler.run_fast(at(5))
    assert missing(kube) == ("2026-01-01T00:00:00Z", ["unified"])
