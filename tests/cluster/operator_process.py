"""Run `llmfleet` commands (the operator, the autoscaler) as real processes against the test
cluster."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.cluster.kube import Kube


class CliProcess:
    """`llmfleet COMMAND ARGS…` as a child process, its output appended to `log`."""

    stop_signal = signal.SIGINT
    """What `stop` sends first; a process still running `stop_timeout` seconds later is killed."""
    stop_timeout = 20.0

    def __init__(self, log: Path, command: str, *args: str, env: dict[str, str]) -> None:
        self.log = log
        self._out = log.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "llmfleet.core.cli", command, *args],
            env={**os.environ, **env}, stdout=self._out, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        return self.process.wait(timeout)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(self.stop_signal)
            try:
                self.process.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self._out.close()


class OperatorProcess(CliProcess):
    def __init__(self, kube: Kube, log: Path, *args: str, env: dict[str, str] | None = None):
        environment = {
            "KUBECONFIG": str(kube.kubeconfig),
            # Short drains and resyncs keep the tests quick; the logic is the same.
            "LLMFLEET_OPERATOR_DRAIN_SECONDS": "3",
            "LLMFLEET_OPERATOR_RESYNC_SECONDS": "5",
            "LLMFLEET_OPERATOR_METRICS_PORT": "0",
            # kwok's pod IPs are fake and off loopback: never send them traffic.
            "LLMFLEET_OPERATOR_PROBE_IN_FLIGHT": "false",
            **(env or {}),
        }
        super().__init__(log, "operator", *args, env=environment)
