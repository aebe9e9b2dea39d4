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
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmfleet.core.capacity_profile import MaxConcurrency
from llmfleet.crds import render
from tests.autoscaler.builders import PROFILE
from tests.autoscaler.prom import EngineSpec, Prometheus, engines
from tests.cluster.kube import Kube, condition, wait_ready
from tests.cluster.operator_process import CliProcess, OperatorProcess

pytestmark = pytest.mark.cluster

NAMESPACE = f"metrics-gap-{os.getpid() % 10000}"
NAME = "quiet"
MODEL = "Qwen/Qwen2.5-7B-Instruct"
MISSING_SECONDS = 3
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


class AutoscalerProcess(CliProcess):
    stop_signal = signal.SIGTERM
    stop_timeout = 10.0

    def __init__(self, kube: Kube, log: Path, prometheus_url: str, profiles: Path) -> None:
        super().__init__(
            log, "autoscaler",
            "--kubeconfig", str(kube.kubeconfig), "-n", NAMESPACE,
            "--prometheus-url", prometheus_url, "--profiles-dir", str(profiles),
            "--interval", "1",
            env={"LLMFLEET_AUTOSCALER_RATE_WINDOW": "5s",
                 "LLMFLEET_AUTOSCALER_STATUS_REFRESH_SECONDS": "2",
                 "LLMFLEET_AUTOSCALER_METRICS_PORT": "0"},
        )  # fmt: skip


@pytest.fixture
def operator(kube: Kube, tmp_path: Path) -> Iterator[OperatorProcess]:
    for manifest in sorted(render.MANIFESTS_DIR.glob("*.yaml")):
        kube.kubectl(
            "apply", "--server-side", "--field-manager=llmfleet-tests", "-f", str(manifest)
        )
    kube.kubectl("wait", "--for=condition=Established", "--timeout=30s", f"crd/{render.CRD_NAME}")
    process = OperatorProcess(
        kube, tmp_path / "operator.log", "--standalone", "-n", NAMESPACE,
        env={"LLMFLEET_OPERATOR_METRICS_MISSING_SECONDS": str(MISSING_SECONDS)},
    )  # fmt: skip
    yield process
    process.stop()
    print(f"--- operator log (tail)\n{process.text()[-3000:]}")


@pytest.fixture
def ns(kube: Kube, operator: OperatorProcess) -> Iterator[str]:
    kube.kubectl("create", "namespace", NAMESPACE)
    yield NAMESPACE
    kube.kubectl("delete", "namespace", NAMESPACE, "--timeout=120s")


def _profiles(directory: Path) -> Path:
    directory.mkdir()
    profile = PROFILE.model_copy(update={
        "model": MODEL,
        "max_concurrency": MaxConcurrency(value=2, limited_by="queueing", tested_up_to=4),
    })  # fmt: skip
    (directory / "quiet.json").write_text(profile.model_dump_json(by_alias=True))
    return directory


def test_no_engine_series_turns_metrics_missing_true_then_false_once_scraped(
    kube: Kube, ns: str, prometheus_binary: Path, sim_binary: Path, tmp_path: Path
) -> None:
    kube.kubectl("apply", "--server-side", "-n", ns, "-f", "-", stdin=SERVICE)
    wait_ready(kube, ns, NAME)
    with (
        Prometheus(prometheus_binary, tmp_path / "prometheus") as prometheus,
        engines(sim_binary, ENGINE) as started,
    ):
        prometheus.set_targets([])  # the ServiceMonitor not selected: no engine is scraped
        scaler = AutoscalerProcess(
            kube, tmp_path / "autoscaler.log", prometheus.url, _profiles(tmp_path / "profiles")
        )
        try:

            def missing() -> dict[str, Any] | None:
                found = condition(kube, ns, NAME, "MetricsMissing")
                return found if found.get("status") == "True" else None

            # Within the documented time: the autoscaler's first pass, 3 s, an operator pass.
            said = kube.wait_for(missing, 60, "MetricsMissing=True")
            print(f"MetricsMissing: {said}")
            assert said["reason"] == "NoEngineSeries"
            assert "unified" in said["message"]
            assert "ServiceMonitor" in said["message"]
            warnings = kube.get("events", "-n", ns, "--field-selector", "type=Warning")["items"]
            assert any(event["reason"] == "NoEngineSeries" for event in warnings), warnings
            listing = kube.kubectl("get", "llmsvc", "-n", ns, "-o", "wide")
            print(listing)
            assert "NoEngineSeries" in listing

            prometheus.set_targets(started)  # the labels fixed: the engines are scraped
            prometheus.wait_scraped(started)

            def arrived() -> dict[str, Any] | None:
                found = condition(kube, ns, NAME, "MetricsMissing")
                return found if found.get("status") == "False" else None

            back = kube.wait_for(arrived, 60, "MetricsMissing=False")
            assert back["reason"] == "SeriesArrive"
        finally:
            scaler.stop()
            print(f"--- autoscaler log (tail)\n{scaler.text()[-3000:]}")
