"""Run `llmfleet` commands (the operator, the autoscaler) as real processes against the test
cluster."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from llmfleet.core import loopback
from tests.cluster.kube import Kube
from tests.cluster.traced import traced, tracee

REPO = Path(__file__).resolve().parents[2]


class CliProcess:
    """`llmfleet COMMAND ARGS…` as a child process, its output appended to `log` (`main`: another
    module run as `python -m MAIN COMMAND ARGS…`, a test's variant); with `trace`,
    under strace, its every connect() written there. LLMFLEET_LOOPBACK_ONLY is on, as for every
    process the local tooling starts (kwok's pod IPs lead off the machine)."""

    stop_signal = signal.SIGINT
    """What `stop` sends first; a process still running `stop_timeout` seconds later is killed."""
    stop_timeout = 20.0

    def __init__(
        self,
        log: Path,
        command: str,
        *args: str,
        env: dict[str, str],
        trace: Path | None = None,
        main: str = "llmfleet.core.cli",
    ) -> None:
        self.log = log
        self._out = log.open("ab")
        argv = [sys.executable, "-m", main, command, *args]
        if main != "llmfleet.core.cli":  # a module of this repository's tests
            env = {
                **env,
                "PYTHONPATH": os.pathsep.join(
                    filter(None, [str(REPO), os.environ.get("PYTHONPATH")])
                ),
            }
        self.traced = trace is not None
        self.process = subprocess.Popen(
            traced(argv, trace) if trace is not None else argv,
            env={**os.environ, loopback.ENV: "true", **env},
            stdout=self._out, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        return self.process.wait(timeout)

    def stop(self) -> None:
        if self.process.poll() is None:
            # Under strace the signal goes to the command; strace exits with it.
            target = tracee(self.process) if self.traced else self.process
            target.send_signal(self.stop_signal)
            try:
                self.process.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self._out.close()


class OperatorProcess(CliProcess):
    def __init__(
        self,
        kube: Kube,
        log: Path,
        *args: str,
        env: dict[str, str] | None = None,
        trace: Path | None = None,
        main: str = "llmfleet.core.cli",
    ):
        environment = {
            "KUBECONFIG": str(kube.kubeconfig),
            # Short drains and resyncs keep the tests quick; the logic is the same.
            "LLMFLEET_OPERATOR_DRAIN_SECONDS": "3",
            "LLMFLEET_OPERATOR_RESYNC_SECONDS": "5",
            "LLMFLEET_OPERATOR_METRICS_PORT": "0",
            # The in-flight probe stays on: kwok's pod IPs are off loopback, so the guard refuses
            # each probe before it connects (and the pod drains for the whole period).
            **(env or {}),
        }
        super().__init__(log, "operator", *args, env=environment, trace=trace, main=main)


_PASSES = re.compile(
    r"^llmfleet_operator_reconcile_seconds_count\{(?P<labels>[^}]*)\} (?P<value>\S+)$"
)


def passes(port: int) -> int:
    """Reconcile passes an operator (its metrics on `port`) has finished, all services and
    outcomes together."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return sum(
        int(float(found["value"]))
        for line in text.splitlines()
        if (found := _PASSES.match(line)) is not None
    )


_STEP = re.compile(r'^llmfleet_operator_start_seconds\{step="(?P<step>\w+)"\} (?P<value>\S+)$')


def start_steps(port: int) -> dict[str, float]:
    """The steps of an operator's start it has reached (its metrics on `port`): seconds from
    its process's start."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {
        found["step"]: float(found["value"])
        for line in text.splitlines()
        if (found := _STEP.match(line)) is not None
    }
