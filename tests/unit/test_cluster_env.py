"""`eval "$(llmfleet cluster env)"` in a shell without the virtualenv on PATH and with another
kubectl first: afterwards `kubectl` is the one built for the cluster and `llmfleet` this one."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

from llmfleet.core.cluster import build
from llmfleet.core.cluster.toolchain import TOOLS_BY_NAME

LLMFLEET = Path(sys.executable).parent / "llmfleet"


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\necho stand-in\n")
    path.chmod(0o755)
    return path


def test_env_puts_the_clusters_kubectl_and_this_llmfleet_first(tmp_path: Path) -> None:
    env = {
        "HOME": str(tmp_path),
        "LLMFLEET_STATE_DIR": str(tmp_path / "state"),
        "LLMFLEET_CACHE_DIR": str(tmp_path / "cache"),
    }
    kubeconfig = tmp_path / "state" / "clusters" / "llmfleet" / "kubeconfig"
    kubeconfig.parent.mkdir(parents=True)
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")  # enough: the cluster "runs"
    ours = build.binary(TOOLS_BY_NAME["kubernetes"], "kubectl", tmp_path / "cache")
    _executable(ours)
    _executable(tmp_path / "elsewhere" / "kubectl")  # say, a distribution's other version
    env["PATH"] = os.pathsep.join([str(tmp_path / "elsewhere"), "/usr/bin", "/bin"])

    printed = subprocess.run(
        [str(LLMFLEET), "cluster", "env"],
        capture_output=True, text=True, timeout=60, check=True, env=env,
    ).stdout  # fmt: skip
    scripts = Path(sysconfig.get_path("scripts"))
    assert printed.splitlines() == [
        f"export KUBECONFIG={kubeconfig}",
        "export LLMFLEET_LOOPBACK_ONLY=true",
        f'export PATH={ours.parent}:{scripts}:"$PATH"',
    ]

    shell = subprocess.run(
        ["sh", "-c", 'eval "$1"; command -v kubectl; command -v llmfleet', "sh", printed],
        capture_output=True, text=True, timeout=30, check=True, env=env,
    ).stdout.splitlines()  # fmt: skip
    assert shell == [str(ours), str(scripts / "llmfleet")]
