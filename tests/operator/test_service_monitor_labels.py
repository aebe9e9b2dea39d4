"""The ServiceMonitor carries the labels a Prometheus selects by (issue 27, item 3): a
kube-prometheus-stack selects ServiceMonitors by its release label, so one without it is never
scraped, and the autoscaler and the canary analysis then wait for series that never come."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from llmfleet.crds import labels as L
from llmfleet.operator.observed import Observed
from llmfleet.operator.plan import desired
from llmfleet.operator.settings import OperatorSettings
from tests.operator.test_plan import load

NOW = datetime(2026, 11, 27, tzinfo=UTC)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({}, {}),
        ({"release": "kube-prometheus-stack"}, {"release": "kube-prometheus-stack"}),
        # The operator's own labels win: they are how it finds (and prunes) its children.
        ({L.SERVICE: "other", "team": "ml"}, {"team": "ml"}),
    ],
    ids=["none", "the release label", "ours cannot be replaced"],
)
def test_service_monitor_labels(given: dict[str, str], expected: dict[str, str]) -> None:
    settings = OperatorSettings(service_monitor_labels=given)
    plan = desired(load("unified"), Observed(service_monitor_crd=True), settings, NOW)
    [monitor] = [o for o in plan.objects if o["kind"] == "ServiceMonitor"]
    labels = monitor["metadata"]["labels"]
    assert labels[L.SERVICE] == "llama-8b"
    assert labels[L.MANAGED_BY] == L.MANAGED_BY_VALUE
    assert {k: v for k, v in labels.items() if k not in (L.SERVICE, L.MANAGED_BY)} == expected
