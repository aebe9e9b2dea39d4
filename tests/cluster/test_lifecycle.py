"""`llmfleet cluster up | status | env | down` as a user runs them, on a second cluster."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import sysconfig
from pathlib import Path

import psutil
import pytest

from llmfleet.core.cluster import LocalCluster

pytestmark = pytest.mark.cluster


def llmfleet(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmfleet.core.cli", *args],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )  # fmt: skip


def listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_up_status_env_down_leaves_nothing_behind(tmp_path: Path) -> None:
    env = {**os.environ, "LLMFLEET_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "200"}
    name = "llmfleet-lifecycle"
    up = llmfleet(env, "cluster", "up", "--name", name, "--nodes", "1", "--gpus-per-node", "4",
                  "--gpu-type", "H200")  # fmt: skip
    assert up.returncode == 0, up.stderr
    seconds = float(re.search(r"ready in ([\d.]+)s", up.stderr)[1])  # type: ignore[index]
    print(f"warm-cache `llmfleet cluster up`: ready in {seconds:.1f}s")
    assert "gpu-h200-0" in up.stdout

    cluster = LocalCluster(name, state=tmp_path / "state")
    pids = cluster.pids()
    assert set(pids) >= {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
                         "kwok-controller"}  # fmt: skip
    ports = {
        conn.laddr.port
        for pid in pids.values()
        for conn in psutil.Process(pid).net_connections(kind="tcp")
        if conn.status == psutil.CONN_LISTEN
    }
    assert ports, "the components listen somewhere"
    for pid in pids.values():
        for conn in psutil.Process(pid).net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN:
                assert conn.laddr.ip == "127.0.0.1", f"pid {pid} listens on {conn.laddr}"

    status = llmfleet(env, "cluster", "status", "--name", name)
    assert status.returncode == 0, status.stderr
    assert "API ready" in status.stdout
    assert "pools: 1 H200 node x 4 GPUs" in status.stdout
    assert "gpu-h200-0" in status.stdout

    exported = llmfleet(env, "cluster", "env", "--name", name).stdout.strip()
    kubectl_dir = LocalCluster.binaries()["kubectl"].parent
    assert exported.splitlines() == [
        f"export KUBECONFIG={cluster.kubeconfig}",
        "export LLMFLEET_LOOPBACK_ONLY=true",
        f'export PATH={kubectl_dir}:{sysconfig.get_path("scripts")}:"$PATH"',
    ]
    assert "~/.kube" not in exported

    again = llmfleet(env, "cluster", "up", "--name", name)
    assert again.returncode == 1
    assert "already running" in again.stderr

    down = llmfleet(env, "cluster", "down", "--name", name)
    assert down.returncode == 0, down.stderr
    alive = [name for name, pid in pids.items() if psutil.pid_exists(pid)
             and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]  # fmt: skip
    assert alive == []
    assert [port for port in ports if listening(port)] == []
    assert not cluster.dir.exists()
    assert llmfleet(env, "cluster", "status", "--name", name).returncode == 1
