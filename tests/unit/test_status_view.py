"""`llmfleet status` shows the MetricsMissing condition (issue 27): a METRICS column and, while
it is True, its message in words under the tables."""

from __future__ import annotations

from typing import Any

import pytest
from rich.console import Console

from llmfleet.core.local.commands import render
from llmfleet.core.local.control import Snapshot, service_row

MESSAGE = "No engine series in Prometheus for unified for 5 min: check the ServiceMonitor's labels"


def _service(*conditions: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "default", "name": "qwen-7b"},
        "spec": {"topology": {"mode": "Unified"}, "slo": {"ttftP95Ms": 500}},
        "status": {"conditions": [
            {"type": "Ready", "status": "True", "reason": "Serving"}, *conditions]},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("conditions", "metrics", "said"),
    [
        pytest.param((), "-", "", id="not-autoscaled"),
        pytest.param(({"type": "MetricsMissing", "status": "False", "reason": "SeriesArrive"},),
                     "ok", "", id="series-arrive"),
        pytest.param(({"type": "MetricsMissing", "status": "True", "reason": "NoEngineSeries",
                       "message": MESSAGE},), "missing", MESSAGE, id="no-engine-series"),
    ],
)  # fmt: skip
def test_the_status_view_shows_metrics_missing(
    conditions: tuple[dict[str, str], ...], metrics: str, said: str
) -> None:
    row = service_row(_service(*conditions))
    assert (row.ready, row.metrics, row.metrics_missing) == ("True Serving", metrics, said)
    console = Console(record=True, width=400)
    console.print(render(Snapshot(services=[row])))
    text = console.export_text()
    assert "METRICS" in text
    assert (f"default/qwen-7b MetricsMissing: {MESSAGE}" in text) == bool(said)
