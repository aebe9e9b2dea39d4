"""The engine-local image's `vllm`: the launcher's `vllm serve …` becomes the simulator flags
the local pod runner gives the same pod (local/engines.py), with the role, the limits and
prefix caching carried over and `LLMFLEET_LOCAL_ENGINE_ARGS` appended last."""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from llmfleet.core.local.engines import COLD_START_SECONDS, ROLE_LATENCY
from llmfleet.core.vllm_shim import ShimError, translate

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
