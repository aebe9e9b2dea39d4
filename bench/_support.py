"""What every benchmark here needs: a free loopback port, CPU pinning, waiting for readiness.

The scripts run as `python bench/NAME.py`, so this directory is on `sys.path` and they import
it as `_support`.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
SOURCE_ROOTS = ("core", "crds", "operator", "autoscaler", "gateway", "runtime_image")
"""The package roots of a checkout (what PYTHONPATH needs to run a commit's components)."""


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


def checkout(commit: str, into: Path) -> Path:
    """The source roots of `commit` (git archive) under `into`, for PYTHONPATH: a `--baseline`
    commit's components run from there beside this checkout's."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, *SOURCE_ROOTS],
                             capture_output=True, check=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into
