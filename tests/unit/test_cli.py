"""Bad input to `llmfleet cluster` is one clear line and a non-zero exit, never a traceback."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmfleet.core.components import unavailable as _unavailable
from llmfleet.core.errors import UserError
from llmfleet.core.options import given


def llmfleet(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmfleet.core.cli", *args],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip


@pytest.fixture
def isolated_env(tmp_path: Path) -> dict[str, str]:
    """No cluster state and an empty binary cache, so nothing real is touched."""
    env = dict(os.environ)
    env["LLMFLEET_STATE_DIR"] = str(tmp_path / "state")
    env["LLMFLEET_CACHE_DIR"] = str(tmp_path / "cache")
    env["COLUMNS"] = "200"
    return env


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def assert_one_line_error(result: subprocess.CompletedProcess[str], message: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert message in lines[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--gpu-type", "X100"], "unknown GPU type 'X100'", id="unknown-gpu-type"),
        pytest.param(["--nodes", "0"], "--nodes must be at least 1, got 0", id="zero-nodes"),
        pytest.param(["--gpus-per-node", "0"], "--gpus-per-node must be at least 1", id="no-gpus"),
        pytest.param(["--port", "70000"], "--port must be between 1 and 65535", id="bad-port"),
        pytest.param(["--pools", "H100=0"], "'H100=0' needs at least 1 node", id="empty-pool"),
        pytest.param(
            ["--pools", "H100=1", "--nodes", "2"],
            "--pools and --nodes/--gpu-type are alternatives",
            id="pools-and-nodes",
        ),
    ],
)
def test_bad_arguments(args: list[str], message: str, isolated_env: dict[str, str]) -> None:
    assert_one_line_error(llmfleet("cluster", "up", *args, env=isolated_env), message)


def test_busy_port(busy_port: int, isolated_env: dict[str, str]) -> None:
    result = llmfleet("cluster", "up", "--port", str(busy_port), env=isolated_env)
    assert_one_line_error(result, f"port 127.0.0.1:{busy_port} is already in use")


def test_missing_go_toolchain(isolated_env: dict[str, str], tmp_path: Path) -> None:
    # Only the Python interpreter's own directory stays on PATH: no `go` anywhere.
    python_dir = tmp_path / "python-only"
    python_dir.mkdir()
    (python_dir / "python").symlink_to(sys.executable)
    assert shutil.which("go", path=str(python_dir)) is None
    isolated_env["PATH"] = str(python_dir)
    result = llmfleet("cluster", "up", env=isolated_env)
    assert_one_line_error(result, "the Go toolchain is not on PATH")


def test_env_and_status_of_a_cluster_that_is_not_running(isolated_env: dict[str, str]) -> None:
    assert_one_line_error(llmfleet("cluster", "env", env=isolated_env), "is not running")
    status = llmfleet("cluster", "status", env=isolated_env)
    assert status.returncode == 1
    assert "is not running" in status.stderr


def test_build_rejects_unknown_tools(isolated_env: dict[str, str]) -> None:
    result = llmfleet("cluster", "build", "docker", env=isolated_env)
    assert_one_line_error(result, "unknown tool(s) docker")


def test_a_component_that_cannot_load_breaks_only_its_own_command() -> None:
    result = CliRunner().invoke(_unavailable("gateway", "ImportError: boom"), [])
    assert result.exit_code != 0
    assert isinstance(result.exception, UserError)
    assert "`llmfleet gateway` cannot load: ImportError: boom" in str(result.exception)


def test_given_keeps_only_the_options_a_user_gave() -> None:
    # typer leaves options the user did not give as None; 0, "" and False were given.
    assert given(host=None, port=0, namespace="", reload=False, url="http://x") == {
        "port": 0,
        "namespace": "",
        "reload": False,
        "url": "http://x",
    }
