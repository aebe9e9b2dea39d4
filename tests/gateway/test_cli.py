"""`llmfleet gateway` as a user runs it: a real process, one-line errors for bad input."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.gateway.servers import free_port, status, wait_for

LLMFLEET = Path(sys.executable).parent / "llmfleet"


def test_gateway_serves_a_static_config(tmp_path: Path) -> None:
    config = tmp_path / "fleet.yaml"
    config.write_text("models:\n  m1:\n    unified: [http://127.0.0.1:1]\n")
    port = free_port()
    process = subprocess.Popen(
        [
            str(LLMFLEET),
            "gateway",
            "--static-config",
            str(config),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: status(f"{url}/readyz") == 200 or None, 20, "the gateway")
        assert [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]] == ["m1"]
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=10)
    # uvicorn shuts down cleanly, then re-raises the captured SIGTERM to the default handler
    assert process.returncode in (0, -signal.SIGTERM)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        pytest.param(["--static-config", "/nonexistent.yaml"], "cannot read", id="missing-file"),
        pytest.param([], "--static-config", id="no-discovery"),
        pytest.param(
            ["--static-config", "/dev/null", "--profile", "fastest"], "unknown", id="bad-profile"
        ),
        pytest.param(
            ["--static-config", "/dev/null", "--port", "70000"],
            "error: gateway setting port: must be at most 65535, got 70000",
            id="bad-port",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_1(args: list[str], fragment: str, tmp_path: Path) -> None:
    # No kubeconfig anywhere: without --static-config, Kubernetes discovery has nothing to use.
    env = {key: value for key, value in os.environ.items() if key != "KUBECONFIG"}
    env["HOME"] = str(tmp_path)
    result = subprocess.run(
        [str(LLMFLEET), "gateway", *args],
        check=False, capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert result.returncode == 1
    assert fragment in result.stderr
    assert "Traceback" not in result.stderr


def test_a_bad_static_config_is_one_line_per_problem(tmp_path: Path) -> None:
    config = tmp_path / "fleet.yaml"
    config.write_text("models:\n  m1:\n    unifed: [http://127.0.0.1:1]\n  m2: {decode: [x]}\n")
    result = subprocess.run(
        [str(LLMFLEET), "gateway", "--static-config", str(config)],
        check=False, capture_output=True, text=True, timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"error: {config}: models.m1.unifed: unknown key",
        f"error: {config}: models.m2.decode[0]: not a URL (relative URL without a base): 'x'",
    ]
