"""The launcher's logs carry no secret (issue 27): the redaction as a table, then a real
launcher whose engine command holds a token from the environment and a secret flag."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from llmfleet.runtime.errors import ExitCode
from llmfleet.runtime.redact import REDACTED, redact, redact_argv, secret_values
from tests.net import free_port
from tests.runtime.processes import LAUNCHER

TOKEN = "hf_abcdefSECRET123456"


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"HF_TOKEN": TOKEN}, [TOKEN]),
        ({"AWS_SECRET_ACCESS_KEY": "xyzxyzxyz"}, ["xyzxyzxyz"]),
        ({"OPENAI_API_KEY": "sk-123456"}, ["sk-123456"]),
        ({"HF_HOME": "/var/cache/hf", "PATH": "/usr/bin"}, []),
        ({"HF_TOKEN": "1"}, []),
    ],
    ids=["token", "secret", "api key", "not secret names", "too short to search"],
)
def test_secret_values_come_from_secret_looking_names(
    environ: dict[str, str], expected: list[str]
) -> None:
    assert secret_values(environ) == expected


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["vllm", "serve", "m", "--api-key", "k-1"], ["vllm", "serve", "m", "--api-key", REDACTED]),
        (["--hf-token=abc"], [f"--hf-token={REDACTED}"]),
        ([f"--hf-overrides={{\"t\":\"{TOKEN}\"}}"], [f"--hf-overrides={{\"t\":\"{REDACTED}\"}}"]),
        (["s3://user:pw@host/m"], [f"s3://user:{REDACTED}@host/m"]),
        (["--port", "8000", "--api-key"], ["--port", "8000", "--api-key"]),
        (["--max-num-seqs", "256"], ["--max-num-seqs", "256"]),
    ],
    ids=["flag value", "flag=value", "secret inside a word", "url password", "flag last",
         "nothing secret"],
)  # fmt: skip
def test_redact_argv(argv: list[str], expected: list[str]) -> None:
    assert redact_argv(argv, [TOKEN]) == expected


def test_redact_takes_the_longest_secret_whole() -> None:
    assert redact("a-abcdefgh-b", secret_values({"A_TOKEN": "abcdef", "B_TOKEN": "abcdefgh"})) == (
        f"a-{REDACTED}-b"
    )


def test_the_launchers_log_names_no_secret(tmp_path: Path) -> None:
    serving = {"port": free_port(), "launcherPort": free_port(), "host": "127.0.0.1"}
    config = {
        "model": {"name": "m"},
        # `--hf-token`: a secret-carrying flag admission allows (`--api-key` is refused).
        "runtime": {"extraArgs": ["--hf-token", "flag-secret-value"]},
        "serving": serving,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    # `false` exits at once: the launcher logs the command line, then the engine's failure.
    engine = f"false --hf-token flag-secret-value --note=pasted-{TOKEN} {{model}}"
    result = subprocess.run(
        [LAUNCHER, "serve", "--config", path, "--engine-command", engine],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "HF_TOKEN": TOKEN},
    )  # fmt: skip
    assert result.returncode == ExitCode.ENGINE_FAILED, result.stderr
    log = result.stdout + result.stderr
    assert "starting engine: false --hf-token <redacted>" in log
    assert TOKEN not in log
    assert "flag-secret-value" not in log
