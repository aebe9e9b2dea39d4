"""Real processes on 127.0.0.1 for the runtime tests: free ports, the simulator, polling."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from tests.net import free_port, status, wait_for

LAUNCHER = Path(sys.executable).parent / "llmfleet-runtime"


def sim_command(binary: Path, port: int | str, model: str, *flags: str) -> list[str]:
    # --force-dummy-tokenizer: never look the model up on a hub.
    return [str(binary), "--port", str(port), "--model", model, "--force-dummy-tokenizer", *flags]


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
