"""A real `llmfleet autoscaler` for the cluster tests of the autoscaler, beside the operator
and the namespace of conftest.py's `operator_namespace`."""

from __future__ import annotations

import signal
from collections.abc import Mapping
from pathlib import Path

from tests.cluster.kube import Kube
from tests.cluster.operator_process import CliProcess

AUTOSCALER_ENV = {
    # The test Prometheus scrapes every second: a rate window of five scrapes.
    "LLMFLEET_AUTOSCALER_RATE_WINDOW": "5s",
    "LLMFLEET_AUTOSCALER_METRICS_PORT": "0",
}


class AutoscalerProcess(CliProcess):
    """`llmfleet autoscaler` for `namespace`, a full pass every `interval` seconds, its output in
    `log`; `env` adds to AUTOSCALER_ENV."""

    stop_signal = signal.SIGTERM
    stop_timeout = 10.0

    def __init__(
        self,
        kube: Kube,
        log: Path,
        namespace: str,
        prometheus_url: str,
        profiles: Path,
        *,
        interval: float,
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(
            log, "autoscaler",
            "--kubeconfig", str(kube.kubeconfig), "-n", namespace,
            "--prometheus-url", prometheus_url, "--profiles-dir", str(profiles),
            "--interval", f"{interval:g}",
            env={**AUTOSCALER_ENV, **(env or {})},
        )  # fmt: skip
