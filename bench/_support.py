"""What every benchmark here needs: a free loopback port, CPU pinning, waiting for readiness.

The scripts run as `python bench/NAME.py`, so this directory is on `sys.path` and they import
it as `_support`.
"""

from __future__ import annotations

import shutil
import socket
import time

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def pinned(cpu: int, command: list[str]) -> list[str]:
    return ["taskset", "-c", str(cpu), *command] if shutil.which("taskset") else command


def wait_ready(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{url} did not become ready in {timeout}s")
