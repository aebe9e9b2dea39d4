"""What one replica of a pool can serve within the SLO: from the capacity profile, or from
per-GPU defaults when the pool has none, scaled by a correction learnt from observed latency.

Per-GPU defaults assume an 8B-class dense model in BF16 (Llama-3.1-8B: 16 GB of weights;
32 layers x 8 KV heads x 128 head dim x 2 (K and V) x 2 bytes = 131,072 bytes of KV per token,
from its `config.json`). They are a starting point for the online correction, not a promise:
a pool serving anything else should be profiled (`llmfleet-runtime profile`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmfleet.core.capacity_profile import CapacityProfile, ItlPoint
from llmfleet.crds.spec import GpuType

_MODEL_FLOPS_PER_TOKEN = 2 * 8e9
"""Forward pass of an 8B dense model: 2 FLOPs per parameter per token."""
_MODEL_WEIGHT_BYTES = 16e9
_KV_BYTES_PER_TOKEN = 131_072
_PREFILL_MFU = 0.4
"""Assumed model-FLOPs utilisation of prefill; an assumption, corrected online."""
_GPU_MEMORY_UTILIZATION = 0.9
"""vLLM's default `--gpu-memory-utilization`."""
_DEFAULT_MAX_CONCURRENCY = 256
"""vLLM's `--max-num-seqs` default on GPUs under 70 GiB and on A100 (batch defaults in
`vllm/engine/arg_utils.py`). H100-class GPUs default to 1024, a scheduler ceiling rather than a
concurrency an ITL target survives, so the lower figure stands for every GPU."""


@dataclass(frozen=True)
class _Gpu:
    bf16_dense_tflops: float
    memory_gb: float


# Dense BF16 tensor TFLOPS and memory per GPU, from NVIDIA's datasheets (H100 SXM5, H200 SXM,
# DGX B200 per GPU, A100 80GB SXM, L4); the sparsity figures are halved.
_GPUS: dict[GpuType, _Gpu] = {
    GpuType.H100: _Gpu(989.0, 80.0),
    GpuType.H200: _Gpu(989.0, 141.0),
    GpuType.B200: _Gpu(2250.0, 180.0),
    GpuType.A100: _Gpu(312.0, 80.0),
    GpuType.L4: _Gpu(121.0, 24.0),
}


@dataclass(frozen=True)
class ReplicaCapacity:
    """One replica's engine, as the policy models it (before the SLO and the correction)."""

    prefill_tokens_per_second: float
    ttft_intercept_ms: float
    """Fixed part of a lone request's TTFT (scheduling, the first decode step)."""
    kv_cache_tokens: float
    max_concurrency: float
    itl: tuple[ItlPoint, ...] = ()
    """ITL p95 against concurrency; empty for the defaults (no ITL model: the online
    correction from observed ITL is all there is)."""
    source: str = "profile"


def default_capacity(gpu_type: GpuType, gpus_per_pod: int) -> ReplicaCapacity:
    """Per-GPU defaults for an 8B BF16 model, scaled by the pod's GPU count (tensor parallel)."""
    gpu = _GPUS[gpu_type]
    prefill = _PREFILL_MFU * gpu.bf16_dense_tflops * 1e12 / _MODEL_FLOPS_PER_TOKEN
    kv_bytes = gpu.memory_gb * 1e9 * _GPU_MEMORY_UTILIZATION * gpus_per_pod - _MODEL_WEIGHT_BYTES
    return ReplicaCapacity(
        prefill_tokens_per_second=prefill * gpus_per_pod,
        ttft_intercept_ms=0.0,
        kv_cache_tokens=max(kv_bytes, 0.0) / _KV_BYTES_PER_TOKEN,
        max_concurrency=_DEFAULT_MAX_CONCURRENCY,
        source=f"{gpu_type.value} defaults",
    )


def profiled_capacity(
    profile: CapacityProfile, gpu_type: GpuType, gpus_per_pod: int
) -> ReplicaCapacity:
    """The profile's figures; what it did not measure falls back to the per-GPU default."""
    default = default_capacity(gpu_type, gpus_per_pod)
    fit = profile.ttft_fit
    return ReplicaCapacity(
        prefill_tokens_per_second=profile.prefill_tokens_per_second
        or default.prefill_tokens_per_second,
        ttft_intercept_ms=fit.intercept_ms if fit is not None else 0.0,
        kv_cache_tokens=float(profile.kv_cache_tokens or default.kv_cache_tokens),
        max_concurrency=float(profile.max_concurrency.value),
        itl=tuple(sorted(profile.itl, key=lambda p: p.concurrency)),
        source="profile",
    )


def prefill_utilization(
    capacity: ReplicaCapacity,
    mean_prompt_tokens: float,
    ttft_target_ms: float | None,
    default: float,
    quantile: float = 0.95,
) -> float:
    """Share of a replica's prefill throughput usable while meeting the TTFT target at
    `quantile` (the target is a percentile, not a mean).

    M/M/1 FCFS: the response time is exponential with mean S / (1 - rho), so its q-quantile is
    ln(1 / (1 - q)) x S / (1 - rho); setting it to the target R gives
    rho = 1 - ln(1 / (1 - q)) x S / R, with S the TTFT of a lone request of the mean prompt
    length. Bounded to [0.1, 0.9]; the online correction takes back what the model gets wrong.
    """
    if ttft_target_ms is None:
        return default
    service_ms = (
        capacity.ttft_intercept_ms
        + 1000.0 * mean_prompt_tokens / capacity.prefill_tokens_per_second
    )
    tail = math.log(1.0 / (1.0 - quantile))
    return min(max(1.0 - tail * service_ms / ttft_target_ms, 0.1), 0.9)


def concurrency_at_itl(capacity: ReplicaCapacity, itl_target_ms: float | None) -> float:
    """Most concurrent streams whose ITL p95 stays within the target: linear interpolation
    between the profile's points, capped by its max concurrency; at least 1."""
    if itl_target_ms is None or not capacity.itl:
        return capacity.max_concurrency
    below = [p for p in capacity.itl if p.p95_ms <= itl_target_ms]
    if not below:
        return 1.0
    best = max(below, key=lambda p: p.concurrency)
    above = [p for p in capacity.itl if p.concurrency > best.concurrency]
    result = float(best.concurrency)
    if above:
        nxt = min(above, key=lambda p: p.concurrency)
        if nxt.p95_ms > best.p95_ms:
            share = (itl_target_ms - best.p95_ms) / (nxt.p95_ms - best.p95_ms)
            result += share * (nxt.concurrency - best.concurrency)
    return max(1.0, min(result, capacity.max_concurrency))


@dataclass(frozen=True)
class Evidence:
    """What one latency target says about the capacity model: target / observed latency at the
    SLO's percentile, < 1 for a miss (`policy._evidence` builds it from goodput or a p95)."""

    cut: float
    """The ratio a cut may use: from the share's lower confidence bound for goodput (a miss only
    when the evidence is beyond chance), the p95's own ratio otherwise; >= 1 when met."""
    comfortable: bool
    """Latency at the SLO's percentile is comfortably below the target (recovery may go on)."""
    source: str
    """How it was measured, for the reason string (`goodput 2.1% over 1.0%`, `p95 900 ms`)."""


def learn(
    correction: float,
    evidence: list[Evidence],
    *,
    elapsed_s: float,
    floor: float,
    recovery_s: float,
) -> float:
    """The next correction factor from each target's evidence, `elapsed_s` after the last.

    - a missed target (cut ratio below 1) cuts the factor by the worst ratio (never below
      `floor`);
    - every target comfortably met (latency below `PolicyConfig.comfortable_latency` x its
      target) lets the factor recover towards 1.0 with time constant `recovery_s`;
    - in between it holds: a pool near its target is sized right, and recovering there would
      only shrink it until it misses again (the sawtooth of a controller without a deadband);
    - unchanged without evidence.

    NOTE: a pool that misses its target because it is short of replicas also lowers the
    factor, so it over-provisions for a while; the floor bounds that, and the recovery undoes
    it once latency is comfortably met.
    """
    if not evidence:
        return correction
    missed = [e.cut for e in evidence if e.cut < 1.0]
    if missed:
        return max(floor, correction * min(missed))
    if all(e.comfortable for e in evidence):
        return correction + (1.0 - correction) * (1.0 - math.exp(-elapsed_s / recovery_s))
    return correction
