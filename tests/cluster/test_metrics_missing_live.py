"""Issue 27's silent metrics gap, live: while Prometheus scrapes none of a service's engines (as
when the operator's ServiceMonitor carries labels the Prometheus' selector does not match, so
the Prometheus Operator gives it no scrape job), `llmfleet autoscaler` and `llmfleet operator`,
real processes over a real Prometheus, turn the service's `MetricsMissing` condition True with
`NoEngineSeries` within the documented time (METRICS_MISSING_SECONDS, 3 s here), and False
again once the engines are scraped (the labels fixed).

No Prometheus Operator runs here: the mismatch is what it leaves Prometheus with, no target of
the engines. The operator runs the pool's pods on kwok nodes (Ready, nothing runs); the
llm-d-inference-sim engines, labelled as the pool's pods, stand in for them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from llmfleet.core.capacity_profile import MaxConcurrency
from tests.autoscaler.builders import PROFILE
from tests.autoscaler.prom import EngineSpec, Prometheus, engines
from tests.cluster.autoscaler_stack import AutoscalerProcess
from tests.cluster.kube import Kube, condition, wait_ready

pytestmark = pytest.mark.cluster

NAMESPACE = f"metrics-gap-{os.getpid() % 10000}"
NAME = "quiet"
MODEL = "Qwen/Qwen2.5-7B-Instruct"
MISSING_SECONDS = 3
OPERATOR_ENV = {"LLMFLEET_OPERATOR_METRICS_MISSING_SECONDS": str(MISSING_SECONDS)}
"""For conftest.py's operator: MetricsMissing after 3 s, not the default 300."""
SERVICE = f"""
apiVersion: llmfleet.dev/v1alpha1
kind: InferenceService
metadata:
  name: {NAME}
spec:
  model: {{name: "{MODEL}"}}
  runtime:
    gpu: {{type: H100, count: 1}}
  topology:
    mode: Unified
    unified: {{replicas: 1, minReplicas: 1, maxReplicas: 2}}
  autoscaling: {{enabled: true}}
"""
ENGINE = EngineSpec(NAMESPACE, NAME, "unified", ("--time-to-first-token", "50ms"))


def _profiles(directory: Path) -> Path:
    directory.mkdir()
    profile = PROFILE.model_copy(update={
        "model": MODEL,
        "max_concurrency": MaxConcurrency(value=2, limited_by="queueing", tested_up_to=4),
    })  # fmt: skip
    (directory / "quiet.json").write_text(profile.model_dump_json(by_alias=True))
    return directory


def test_no_engine_series_turns_metrics_missing_true_then_false_once_scraped(
    kube: Kube, operator_namespace: str, prometheus_binary: Path, sim_binary: Path, tmp_path: Path
) -> None:
    kube.kubectl("apply", "--server-side", "-n", operator_namespace, "-f", "-", stdin=SERVICE)
    wait_ready(kube, operator_namespace, NAME)
    with (
        Prometheus(prometheus_binary, tmp_path / "prometheus") as prometheus,
        engines(sim_binary, ENGINE) as started,
    ):
        prometheus.set_targets([])  # the ServiceMonitor not selected: no engine is scraped
        scaler = AutoscalerProcess(
            kube, tmp_path / "autoscaler.log", NAMESPACE, prometheus.url,
            _profiles(tmp_path / "profiles"), interval=1,
            env={"LLMFLEET_AUTOSCALER_STATUS_REFRESH_SECONDS": "2"},
        )  # fmt: skip
        try:

            def missing() -> dict[str, Any] | None:
                found = condition(kube, operator_namespace, NAME, "MetricsMissing")
                return found if found.get("status") == "True" else None

            # Within the documented time: the autoscaler's first pass, 3 s, an operator pass.
            said = kube.wait_for(missing, 60, "MetricsMissing=True")
            print(f"MetricsMissing: {said}")
            assert said["reason"] == "NoEngineSeries"
            assert "unified" in said["message"]
            assert "ServiceMonitor" in said["message"]
            warnings = kube.get(
                "events", "-n", operator_namespace, "--field-selector", "type=Warning"
            )["items"]
            assert any(event["reason"] == "NoEngineSeries" for event in warnings), warnings
            listing = kube.kubectl("get", "llmsvc", "-n", operator_namespace, "-o", "wide")
            print(listing)
            assert "NoEngineSeries" in listing

            prometheus.set_targets(started)  # the labels fixed: the engines are scraped
            prometheus.wait_scraped(started)

            def arrived() -> dict[str, Any] | None:
                found = condition(kube, operator_namespace, NAME, "MetricsMissing")
                return found if found.get("status") == "False" else None

            back = kube.wait_for(arrived, 60, "MetricsMissing=False")
            assert back["reason"] == "SeriesArrive"
        finally:
            scaler.stop()
            print(f"--- autoscaler log (tail)\n{scaler.text()[-3000:]}")
