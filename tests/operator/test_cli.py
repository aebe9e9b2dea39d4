"""`llmfleet operator` (and the autoscaler, which connects the same way) without a usable
kubeconfig: one line that says where it looked and how to get a cluster, exit 1, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

LLMFLEET = Path(sys.executable).parent / "llmfleet"


def run(args: list[str], kubeconfig: Path, home: Path) -> subprocess.CompletedProcess[str]:
    """`llmfleet ARGS` as a person runs it, outside any pod: no in-cluster variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_SERVICE_")}
    env |= {"KUBECONFIG": str(kubeconfig), "HOME": str(home), "COLUMNS": "200"}
    return subprocess.run(
        [str(LLMFLEET), *args], capture_output=True, text=True, timeout=60, env=env, check=False
    )


@pytest.mark.parametrize(
    ("content", "says"),
    [
        pytest.param(None, "does not exist", id="missing-file"),
        pytest.param("just text\n", "is not a kubeconfig file", id="not-a-kubeconfig"),
        pytest.param(
            "apiVersion: v1\nkind: Config\n",
            "cannot be used: Invalid kube-config file. Expected key current-context",
            id="no-context",
        ),
    ],
)
@pytest.mark.parametrize(
    "command",
    [
        pytest.param(["operator", "--standalone"], id="operator"),
        pytest.param(["autoscaler", "--once"], id="autoscaler"),
    ],
)
def test_no_usable_kubeconfig_is_one_line(
    tmp_path: Path, command: list[str], content: str | None, says: str
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    if content is not None:
        kubeconfig.write_text(content)
    result = run(command, kubeconfig, tmp_path)
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    (line,) = lines
    assert line.startswith(
        f"error: no Kubernetes cluster to talk to: not running in a pod, and "
        f"KUBECONFIG={kubeconfig} {says}"
    ), line
    assert line.endswith(
        '(`llmfleet cluster up` starts a local one; then `eval "$(llmfleet cluster env)"`)'
    )
    assert result.stdout == ""
