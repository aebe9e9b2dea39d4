"""`vllm` in the engine-local image: the launcher's `vllm serve …` becomes llm-d-inference-sim.

The launcher (`llmfleet-runtime serve`) plans and execs `vllm serve MODEL --option …` exactly as
in the runtime image (runtime/args.py); this shim reads the options that matter to a simulated
engine and execs the simulator with the flags the local pod runner gives it (local/engines.py):
the port, the model and served name, the context length, `--max-num-seqs`, KV-cache simulation
with prefix caching (off with `--disable-prefix-caching`), the role's latency and the simulated
cold start, then `LLMFLEET_LOCAL_ENGINE_ARGS` from the environment. Every other vLLM option
(GPU memory, CUDA graphs, parallelism, …) has no meaning for a simulator and is ignored.

The role: a LMCache connector names it in `--kv-transfer-config` (`kv_producer` is a prefill
engine, `kv_consumer` a decode engine); NIXL runs both sides as `kv_both`, so the role is then
read from the launcher's own config (`--config` of the parent process), as is the role of an
engine without a connector (unified).

The engine listens on every address (the pod's IP) on the planned `--port`, 8000 by default.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from llmfleet.core.local.engines import ENGINE_PORT, EngineConfigError, engine_argv

SIMULATOR = "/usr/local/bin/llm-d-inference-sim"
KV_ROLES = {"kv_producer": "prefill", "kv_consumer": "decode"}
KV_CACHE_FLAGS = ("--enable-kvcache", "--block-size=", "--kv-cache-size=")
"""What engines.py adds for KV-cache simulation (prefix caching), dropped when it is off."""


class ShimError(ValueError):
    """The argv is not a `vllm serve` this shim can translate."""


def _options(words: Sequence[str]) -> dict[str, str | None]:
    """`--flag value` and `--flag=value` pairs; a flag followed by another flag has no value."""
    options: dict[str, str | None] = {}
    index = 0
    while index < len(words):
        word = words[index]
        if not word.startswith("--"):
            index += 1
            continue
        if "=" in word:
            flag, value = word.split("=", 1)
            options[flag] = value
        elif index + 1 < len(words) and not words[index + 1].startswith("--"):
            options[word] = words[index + 1]
            index += 1
        else:
            options[word] = None
        index += 1
    return options


def _role(options: Mapping[str, str | None], launcher_config: Mapping[str, Any]) -> str:
    transfer = options.get("--kv-transfer-config")
    if transfer:
        kv_role = json.loads(transfer).get("kv_role", "")
        if kv_role in KV_ROLES:
            return KV_ROLES[kv_role]
    return str(launcher_config.get("role") or "unified")


def translate(
    argv: Sequence[str],
    env: Mapping[str, str],
    launcher_config: Mapping[str, Any] | None = None,
    simulator: str = SIMULATOR,
) -> list[str]:
    """The simulator's argv for `argv` (`vllm serve MODEL …`, without the program name)."""
    if len(argv) < 2 or argv[0] != "serve" or argv[1].startswith("--"):
        raise ShimError(f"expected `vllm serve MODEL [OPTIONS]`, got `vllm {' '.join(argv)}`")
    options = _options(argv[2:])
    model: dict[str, Any] = {"name": argv[1]}
    if options.get("--served-model-name"):
        model["servedName"] = options["--served-model-name"]
    if options.get("--max-model-len"):
        model["maxModelLen"] = int(str(options["--max-model-len"]))
    runtime: dict[str, Any] = {}
    if options.get("--max-num-seqs"):
        runtime["maxNumSeqs"] = int(str(options["--max-num-seqs"]))
    config = {
        "role": _role(options, launcher_config or {}),
        "port": int(options.get("--port") or ENGINE_PORT),
        "model": model,
        "runtime": runtime,
    }
    try:
        words = engine_argv(simulator, config, env)
    except EngineConfigError as error:
        raise ShimError(str(error)) from None
    if "--disable-prefix-caching" in options:
        words = [w for w in words if not w.startswith(KV_CACHE_FLAGS)]
    return words


def _launcher_config() -> dict[str, Any]:
    """The parent launcher's runtime config (its `--config` file), or {} when unreadable."""
    try:
        cmdline = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().split(b"\0")
        words = [word.decode() for word in cmdline]
        path = _options(words).get("--config")
        loaded = yaml.safe_load(Path(path).read_text()) if path else None
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        command = translate(words, os.environ, _launcher_config())
    except (ShimError, ValueError) as error:
        print(f"vllm (llmfleet's simulator shim): error: {error}", file=sys.stderr)
        return 2
    print(f"vllm (llmfleet's simulator shim): exec {' '.join(command)}", file=sys.stderr)
    os.execv(command[0], command)
