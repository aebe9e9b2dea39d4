"""`llmfleet-runtime serve --print-args`, and the launcher's one-line errors and exit codes."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from llmfleet.runtime.errors import ExitCode
from tests.runtime.processes import LAUNCHER

GOOD = "model: {name: meta-llama/Llama-3.1-8B-Instruct}\nruntime: {gpu: {type: H200, count: 2}}\n"


def _serve(
    tmp_path: Path, text: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "runtime.yaml"
    path.write_text(text)
    environ = {k: v for k, v in os.environ.items() if k != "LLMFLEET_RUNTIME_GPU"}
    return subprocess.run(
        [LAUNCHER, "serve", "--config", path, "--print-args"],
        capture_output=True, text=True, timeout=60, check=False, env={**environ, **(env or {})},
    )  # fmt: skip


def test_print_args_is_one_json_array(tmp_path: Path) -> None:
    result = _serve(tmp_path, GOOD)
    assert result.returncode == 0, result.stderr
    argv = json.loads(result.stdout)
    assert argv[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"]
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    assert result.stdout.count("\n") == 1


def test_gpu_override_from_the_environment_wins(tmp_path: Path) -> None:
    result = _serve(tmp_path, GOOD, {"LLMFLEET_RUNTIME_GPU": "A100:4"})
    argv = json.loads(result.stdout)
    assert argv[argv.index("--tensor-parallel-size") + 1] == "4"
    assert argv[argv.index("--kv-cache-dtype") + 1] == "auto"


@dataclass(frozen=True)
class Bad:
    id: str
    text: str
    code: ExitCode
    words: str
    env: dict[str, str] = field(default_factory=dict)


BAD = [
    Bad("malformed-yaml", "model: {name: m\nruntime: [", ExitCode.BAD_CONFIG,
        "not valid YAML/JSON"),
    Bad("not-a-mapping", "- just\n- a list\n", ExitCode.BAD_CONFIG, "must be a mapping"),
    Bad("schema-error", "model: {name: m}\nruntime: {maxNumSeqs: -1}\n", ExitCode.BAD_CONFIG,
        "runtime.maxNumSeqs: Input should be greater than or equal to 1"),
    Bad("unknown-field", "model: {name: m}\nruntme: {}\n", ExitCode.BAD_CONFIG,
        "runtme: Extra inputs are not permitted"),
    Bad("engine-port-is-the-side-port", "model: {name: m}\nport: 8001\n", ExitCode.BAD_CONFIG,
        "serving, with overrides: Value error, port and launcherPort are both 8001"),
    Bad("unknown-gpu-type", "model: {name: m}\nruntime: {gpu: {type: V100}}\n",
        ExitCode.UNKNOWN_GPU, "unknown GPU type 'V100'"),
    Bad("unknown-gpu-from-env", GOOD, ExitCode.UNKNOWN_GPU, "unknown GPU type 'T4'",
        {"LLMFLEET_RUNTIME_GPU": "T4"}),
    Bad("tp-larger-than-gpus", "model: {name: m}\nruntime: {gpu: {count: 2}, tensorParallel: 8}\n",
        ExitCode.BAD_PARALLELISM, "tensorParallel 8 needs 8 GPUs but this pod has 2 H100"),
    Bad("unknown-kv-connector", "model: {name: m}\nrole: decode\nkvTransfer: {connector: P2p}\n",
        ExitCode.UNKNOWN_KV_CONNECTOR, "unknown KV connector 'P2p'"),
    Bad("conflicting-extra-args",
        "model: {name: m}\nruntime: {prefixCaching: true, extraArgs: [--disable-prefix-caching]}\n",
        ExitCode.CONFLICTING_ARGS, "contradicts runtime.prefixCaching"),
]  # fmt: skip


@pytest.mark.parametrize("bad", BAD, ids=[bad.id for bad in BAD])
def test_bad_input_is_one_line_and_its_own_exit_code(tmp_path: Path, bad: Bad) -> None:
    result = _serve(tmp_path, bad.text, bad.env)
    assert result.returncode == bad.code
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("llmfleet-runtime: error: ")
    assert bad.words in result.stderr


def test_missing_config_file(tmp_path: Path) -> None:
    result = subprocess.run(
        [LAUNCHER, "serve", "--config", tmp_path / "absent.yaml", "--print-args"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == ExitCode.BAD_CONFIG
    assert "cannot read config" in result.stderr


def test_the_bad_input_exit_codes_are_distinct() -> None:
    codes = {bad.code for bad in BAD}
    assert len(codes) == 5
    assert len({int(code) for code in ExitCode}) == len(ExitCode)
