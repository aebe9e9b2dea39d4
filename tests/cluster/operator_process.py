"""Run `llmfleet operator` as a real process against the test cluster."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.cluster.kube import Kube


class OperatorProcess:
    def __init__(self, kube: Kube, log: Path, *args: str, env: dict[str, str] | None = None):
        self.log = log
        environment = {
            **os.environ,
            "KUBECONFIG": str(kube.kubeconfig),
            # Short drains and resyncs keep the tests quick; the logic is the same.
            "LLMFLEET_OPERATOR_DRAIN_SECONDS": "3",
            "LLMFLEET_OPERATOR_RESYNC_SECONDS": "5",
            "LLMFLEET_OPERATOR_METRICS_PORT": "0",
            # kwok's pod IPs are fake and off loopback: never send them traffic.
            "LLMFLEET_OPERATOR_PROBE_IN_FLIGHT": "false",
            **(env or {}),
        }
        self._out = log.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "llmfleet.core.cli", "operator", *args],
            env=environment, stdout=self._out, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        return self.process.wait(timeout)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self._out.close()
