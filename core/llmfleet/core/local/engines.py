"""The engine behind a local pod: llm-d-inference-sim's command line from the pod's runtime config.

A real engine pod runs the launcher (`llmfleet-runtime serve --config /etc/llmfleet/<pool>.json`),
which starts vLLM on a GPU on the config's `port` and answers readiness on a side port. Locally
there is no GPU, so the pod runner starts llm-d-inference-sim on that same `port` instead (its own
`/health/ready` standing in for the launcher's readiness), with what the same runtime config
says: the served model name, the context length, `maxNumSeqs`, the role, and KV-cache simulation
with prefix caching (`--enable-kvcache`, block size 16), so the engines' `vllm:*` metrics move
with the traffic.

Latency per role (`ROLE_LATENCY`) is a documented stand-in for an 8B-class model on one H100,
so the pools behave differently: a prefill engine is charged per prompt token; a decode engine
pays a KV transfer per prompt token instead and generates tokens faster; a unified engine does
both. `--time-factor-under-load` makes every figure grow with the batch, as on a GPU, so
latency rises with load and the autoscaler has something to see.

Memory: llm-d-inference-sim v0.10.2 allocates, at start, a channel of one float64 per token
that could ever be in flight (its time-per-output-token metric's queue, `metrics.tpotChan`):
8 bytes x (`--max-num-seqs` + `--max-waiting-queue-length`) x `--max-model-len`, 258 MiB with
its default waiting queue of 1000 and our 32 seqs of 32k tokens. The pages are not touched at
first, but the Go heap counts them as live, so the garbage collector lets the heap grow to twice
that before it collects: every request's garbage (a 256 KiB response channel of `--max-model-len`
pointers among it) lands on fresh pages until the resident set reaches ~300 MiB, whatever the
load, and the ring's own pages follow as tokens are generated. `engine_argv` therefore bounds
the waiting queue (`waiting_queue_length`) so that the ring stays within `TPOT_RING_BYTES`;
bench/sim_memory.py measures both (bench/results/sim-memory.txt). A `GOMEMLIMIT` alone (what
the engine-local image's shim adds, vllm_shim.py) would not do: the untouched ring counts
against it, and the collector would run without pause below it.

A new engine is not ready for `COLD_START_SECONDS` (a stand-in for a GPU's minutes of model
loading), so warm spares matter here as they do on a cluster.

Local only: `LOCAL_ARGS_ENV` in the service's `spec.runtime.env` appends simulator flags, which
win over ours (`--startup-duration=0s` for an instant start, `--time-to-first-token=500ms` for a
slow engine); a real pod's launcher ignores it.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

LOCAL_ARGS_ENV = "LLMFLEET_LOCAL_ENGINE_ARGS"
"""Extra llm-d-inference-sim flags for a local engine (shell words), from `spec.runtime.env`."""

ENGINE_PORT = 8000
DEFAULT_MAX_NUM_SEQS = 32
"""Concurrent sequences when the spec leaves `maxNumSeqs` unset (vLLM's own default is 256 on
a GPU with memory to spare; 32 makes a local engine saturate at a load a laptop can send)."""
DEFAULT_MAX_MODEL_LEN = 32_768
COLD_START_SECONDS = 8
"""How long a new engine answers 503 on /health/ready (llm-d-inference-sim's
`--startup-duration`), standing in for loading weights and capturing CUDA graphs, which take
minutes on a GPU: long enough locally that a warm spare visibly beats a cold start."""
KV_CACHE_BLOCKS = 4096
"""KV-cache blocks of 16 tokens (65k tokens): a few long prompts fill it, as on a small GPU."""

TPOT_RING_BYTES = 64 * 2**20
"""What the simulator's per-token metric ring may take: 8 bytes x (seqs + waiting) x max-model-len
(256 sequences of 32k tokens). The waiting queue is sized to it (`waiting_queue_length`)."""
TPOT_SLOT_BYTES = 8


def waiting_queue_length(max_num_seqs: int, max_model_len: int) -> int:
    """`--max-waiting-queue-length` for an engine of `max_num_seqs` sequences of `max_model_len`
    tokens: what fills the simulator's per-token metric ring to `TPOT_RING_BYTES` (the seqs come
    first), but never fewer than `max_num_seqs` waiting requests (a full batch can queue behind
    the running one; a request beyond is answered 429, as an overloaded engine would shed it)."""
    slots = TPOT_RING_BYTES // (TPOT_SLOT_BYTES * max_model_len)
    return max(max_num_seqs, slots - max_num_seqs)


@dataclass(frozen=True)
class Latency:
    """Simulated timings of one role (llm-d-inference-sim's flags)."""

    prefill_overhead_ms: float
    prefill_per_token_ms: float
    inter_token_ms: float
    kv_transfer_per_token_ms: float = 0.0
    under_load_factor: float = 2.0
    """How much slower a full batch is than a lone request."""

    def flags(self) -> list[str]:
        flags = [
            f"--prefill-overhead={self.prefill_overhead_ms:g}ms",
            f"--prefill-time-per-token={self.prefill_per_token_ms:g}ms",
            f"--inter-token-latency={self.inter_token_ms:g}ms",
            f"--time-factor-under-load={self.under_load_factor:g}",
        ]
        if self.kv_transfer_per_token_ms:
            flags.append(f"--kv-cache-transfer-time-per-token={self.kv_transfer_per_token_ms:g}ms")
        return flags


ROLE_LATENCY = {
    "unified": Latency(prefill_overhead_ms=20, prefill_per_token_ms=0.08, inter_token_ms=20),
    "prefill": Latency(prefill_overhead_ms=20, prefill_per_token_ms=0.06, inter_token_ms=20),
    "decode": Latency(
        prefill_overhead_ms=5,
        prefill_per_token_ms=0.0,
        inter_token_ms=15,
        kv_transfer_per_token_ms=0.01,
    ),
}
"""Per-role timings: prefill ~12-16k prompt tokens/s, decode 50-65 tokens/s per sequence
(the order of an 8B model on one H100); the KV hand-over ~100k tokens/s."""


class EngineConfigError(ValueError):
    """The pod's runtime config cannot become an engine (the message says which field)."""


def engine_argv(
    binary: str, config: Mapping[str, Any], env: Mapping[str, str], seed: int = 0
) -> list[str]:
    """The simulator's command line for a pod whose runtime config is `config` (the ConfigMap's
    JSON) and whose container environment is `env`."""
    role = str(config.get("role", "unified"))
    if role not in ROLE_LATENCY:
        raise EngineConfigError(f"role {role!r} is not one of {', '.join(ROLE_LATENCY)}")
    model = config.get("model") or {}
    runtime = config.get("runtime") or {}
    served = model.get("servedName") or model.get("name")
    if not served:
        raise EngineConfigError("model.name is missing")
    max_model_len = int(model.get("maxModelLen") or DEFAULT_MAX_MODEL_LEN)
    max_num_seqs = int(runtime.get("maxNumSeqs") or DEFAULT_MAX_NUM_SEQS)
    argv = [
        binary,
        f"--port={int(config.get('port', ENGINE_PORT))}",
        f"--model={model.get('name') or served}",
        f"--served-model-name={served}",
        "--force-dummy-tokenizer",  # never look a tokenizer up on a hub
        f"--max-model-len={max_model_len}",
        f"--max-num-seqs={max_num_seqs}",
        f"--max-waiting-queue-length={waiting_queue_length(max_num_seqs, max_model_len)}",
        "--enable-kvcache",
        "--block-size=16",
        f"--kv-cache-size={KV_CACHE_BLOCKS}",
        f"--seed={seed}",
        f"--startup-duration={COLD_START_SECONDS}s",
        *ROLE_LATENCY[role].flags(),
    ]
    extra = env.get(LOCAL_ARGS_ENV, "")
    try:
        argv += shlex.split(extra)
    except ValueError as error:
        raise EngineConfigError(f"{LOCAL_ARGS_ENV}={extra!r}: {error}") from None
    return argv
