"""What every benchmark here needs: a free loopback port, CPU pinning, waiting for readiness.

The scripts run as `python bench/NAME.py`, so this directory is on `sys.path` and they import
it as `_support`.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

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


def revision_env(source: Path | None, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (this process's by default) for a process of `source`'s revision: its source roots
    (`checkout`) on PYTHONPATH; with None, this checkout's, `env` as it is."""
    found = dict(os.environ if env is None else env)
    if source is not None:
        found["PYTHONPATH"] = os.pathsep.join(str(root) for root in sorted(source.iterdir()))
    return found


def worker(command: list[str], source: Path | None, what: str = "worker") -> Any:
    """`python *command` run as `source`'s revision (`revision_env`): what it printed, read as
    JSON. A worker that fails stops the benchmark with the end of its stderr."""
    done = subprocess.run([sys.executable, *command], env=revision_env(source),
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        sys.exit(f"{what} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def checkout(commit: str, into: Path) -> Path:
    """The source roots of `commit` (git archive) under `into`, for PYTHONPATH: a `--baseline`
    commit's components run from there beside this checkout's."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, *SOURCE_ROOTS],
                             capture_output=True, check=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into
