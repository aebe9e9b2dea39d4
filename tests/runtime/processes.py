"""Real processes on 127.0.0.1 for the runtime tests: free ports, the simulator, polling."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import httpx

T = TypeVar("T")
LAUNCHER = Path(sys.executable).parent / "llmfleet-runtime"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def sim_command(binary: Path, port: int | str, model: str, *flags: str) -> list[str]:
    # --force-dummy-tokenizer: never look the model up on a hub.
    return [str(binary), "--port", str(port), "--model", model, "--force-dummy-tokenizer", *flags]


def wait_for(check: Callable[[], T | None], timeout: float, what: str) -> T:
    """Poll `check` until it returns something other than None, or fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result is not None:
            return result
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return None


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
