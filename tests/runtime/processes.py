"""Real processes on 127.0.0.1 for the runtime tests: free ports, the simulator, launchers."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.net import free_port, status, wait_for

LAUNCHER = Path(sys.executable).parent / "llmfleet-runtime"
REPO = Path(__file__).resolve().parents[2]


def sim_command(binary: Path, port: int | str, model: str, *flags: str) -> list[str]:
    # --force-dummy-tokenizer: never look the model up on a hub.
    return [str(binary), "--port", str(port), "--model", model, "--force-dummy-tokenizer", *flags]


def standin_command(name: str, *flags: str) -> list[str]:
    """tests/runtime/engine_standin.py as a launcher's engine command (placeholders unfilled)."""
    return [sys.executable, "-m", "tests.runtime.engine_standin", "--host", "{host}",
            "--port", "{port}", "--model", "{model}", "--name", name, *flags]  # fmt: skip


def stop(process: subprocess.Popen[bytes]) -> None:
    """End a process this test started (by its own pid) and reap it."""
    if process.poll() is None:
        process.send_signal(signal.SIGKILL)
    process.wait(timeout=10)


@contextlib.contextmanager
def running_sim(binary: Path, model: str, *flags: str) -> Iterator[str]:
    """A simulator on a free port until the block ends; yields its base URL."""
    port = free_port()
    process = subprocess.Popen(
        sim_command(binary, port, model, *flags),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: status(f"{url}/health/ready") == 200 or None, 15, "the simulator")
        yield url
    finally:
        stop(process)


@dataclass
class Launcher:
    """`llmfleet-runtime serve` with its engine: the pod's two ports, as a kubelet sees them."""

    process: subprocess.Popen[bytes]
    engine: str
    """The pod's serving port: the engine itself (what a Service targets)."""
    side: str
    """The launcher's side port (what the readiness probe and the preStop hook call)."""
    log: Path

    def ready(self) -> int | None:
        return status(f"{self.side}/ready")

    def wait_ready(self) -> None:
        wait_for(lambda: self.ready() == 200 or None, 30, "readiness")

    def pre_stop(self, timeout: float = 60) -> httpx.Response:
        """The kubelet's preStop hook: GET /drain, which answers when the drain ends."""
        return httpx.get(f"{self.side}/drain", timeout=timeout)

    def exit_code(self, timeout: float) -> int:
        return self.process.wait(timeout=timeout)

    def last_line(self) -> str:
        lines = [line for line in self.log.read_text().splitlines() if "llmfleet-runtime" in line]
        return lines[-1]


class Launchers:
    """Starts launchers for one test (configs and logs under `folder`); `close` ends them."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.started: list[Launcher] = []

    def start(
        self,
        engine: list[str],
        config: dict[str, Any],
        env: dict[str, str] | None = None,
    ) -> Launcher:
        """A launcher running `engine` (placeholders unfilled) under `config`, to which the
        ports are added (and `serving.host`: 127.0.0.1)."""
        port, side_port = free_port(), free_port()
        serving = {"port": port, "launcherPort": side_port, "host": "127.0.0.1"}
        config = {**config, "serving": serving | config.get("serving", {})}
        path = self.folder / f"config-{port}.json"
        path.write_text(json.dumps(config))
        log = self.folder / f"launcher-{port}.log"
        with log.open("wb") as sink:
            process = subprocess.Popen(
                [LAUNCHER, "serve", "--config", path, "--engine-command", " ".join(engine)],
                stdout=sink,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                cwd=REPO,  # `python -m tests.runtime.engine_standin` imports from here
            )
        launcher = Launcher(
            process, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{side_port}", log
        )
        self.started.append(launcher)
        return launcher

    def close(self) -> None:
        for launcher in self.started:
            # SIGTERM first: the launcher stops its engine; SIGKILL only if it does not exit.
            if launcher.process.poll() is None:
                launcher.process.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    launcher.process.wait(timeout=20)
            stop(launcher.process)
