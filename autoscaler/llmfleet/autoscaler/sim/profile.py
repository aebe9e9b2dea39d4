"""The engine model as `llmfleet-runtime profile` would measure it, and replicas for a load.

`engine_profile` plays the profiler against the step-time model: TTFT of lone prompts of 256 to
16k tokens (and the least-squares line through them), ITL at 1 to 512 concurrent streams of a
1,000-token prompt and 200-token answer (the profiler's defaults), and the KV capacity. Our
policy and the Dynamo planner get this profile, as they would in production; the threshold
baselines need none.

`replicas_for` sizes a load with the policy's own sizing functions (no forecast, no correction):
the static-peak baseline uses it on the trace's busiest minute, and the report uses it for the
capacity a load step needs.
"""

from __future__ import annotations

from datetime import UTC, datetime

from llmfleet.autoscaler.capacity import profiled_capacity
from llmfleet.autoscaler.inputs import PolicyConfig, PoolSignals
from llmfleet.autoscaler.sim.model import EngineModel
from llmfleet.autoscaler.sim.traces import Trace
from llmfleet.autoscaler.sizing import decode_need, prefill_need
from llmfleet.core.capacity_profile import (
    CapacityProfile,
    ItlPoint,
    MaxConcurrency,
    TtftFit,
    TtftPoint,
)
from llmfleet.crds.spec import GpuType, SloSpec

_PROMPTS = (256, 1024, 4096, 16384)
_CONCURRENCY = (1, 8, 16, 32, 64, 128, 256, 512)
_PROFILE_PROMPT = 1000
_PROFILE_OUTPUT = 200


def engine_profile(model: EngineModel) -> CapacityProfile:
    ttft = [
        TtftPoint(
            prompt_tokens=n,
            requested_tokens=n,
            p50_ms=1000 * model.lone_ttft_s(n),
            p95_ms=1000 * model.lone_ttft_s(n),
            samples=1,
        )
        for n in _PROMPTS
    ]
    xs = [float(p.prompt_tokens) for p in ttft]
    ys = [p.p50_ms for p in ttft]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mean_x) ** 2 for x in xs
    )
    context = _PROFILE_PROMPT + _PROFILE_OUTPUT / 2
    itl = []
    for c in _CONCURRENCY:
        step_ms = 1000 * model.decode_step_s(c, c * context)
        itl.append(
            ItlPoint(
                concurrency=c,
                p50_ms=step_ms,
                p95_ms=step_ms,
                ttft_p50_ms=1000 * model.lone_ttft_s(_PROFILE_PROMPT),
                output_tokens_per_second=c * 1000 / step_ms,
                samples=1,
            )
        )
    return CapacityProfile(
        url="sim://engine",
        model="8B BF16 on H100 (simulated)",
        measured_at=datetime(2026, 1, 1, tzinfo=UTC).isoformat(),
        output_tokens=_PROFILE_OUTPUT,
        ttft=ttft,
        ttft_fit=TtftFit(intercept_ms=mean_y - slope * mean_x, ms_per_prompt_token=slope),
        prefill_tokens_per_second=1000.0 / slope,
        itl=itl,
        decode_step_ms=itl[0].p50_ms,
        max_concurrency=MaxConcurrency(
            value=_CONCURRENCY[-1], limited_by="search-limit", tested_up_to=_CONCURRENCY[-1]
        ),
        kv_cache_tokens=model.kv_tokens,
    )


def replicas_for(
    rate: float,
    mean_prompt: float,
    mean_output: float,
    *,
    profile: CapacityProfile,
    slo: SloSpec,
    gpus_per_pod: int = 1,
) -> int:
    """Replicas the policy's sizing asks for `rate` requests/s of this size (at least 1)."""
    signals = PoolSignals(
        observed_at=datetime(2026, 1, 1, tzinfo=UTC),
        request_rate=rate,
        prompt_tokens_rate=rate * mean_prompt,
        mean_prompt_tokens=mean_prompt,
        mean_output_tokens=mean_output,
    )
    capacity = profiled_capacity(profile, GpuType.H100, gpus_per_pod)
    prefill = prefill_need(
        signals, growth=1.0, capacity=capacity, correction=1.0, slo=slo, config=PolicyConfig()
    )
    decode = decode_need(signals, growth=1.0, ready=0, capacity=capacity, correction=1.0, slo=slo)
    return max(prefill.replicas, decode.replicas, 1)


def windows(
    trace: Trace, window_s: float, step_s: float
) -> list[tuple[float, float, float, float]]:
    """(start, requests/s, mean prompt, mean output) over sliding windows of the trace."""
    result: list[tuple[float, float, float, float]] = []
    requests = trace.requests
    lo = hi = 0
    start = 0.0
    while start <= trace.duration:
        while lo < len(requests) and requests[lo].arrival < start:
            lo += 1
        while hi < len(requests) and requests[hi].arrival < start + window_s:
            hi += 1
        count = hi - lo
        if count:
            prompt = sum(r.prompt_tokens for r in requests[lo:hi]) / count
            output = sum(r.output_tokens for r in requests[lo:hi]) / count
            result.append((start, count / window_s, prompt, output))
        else:
            result.append((start, 0.0, 0.0, 0.0))
        start += step_s
    return result
