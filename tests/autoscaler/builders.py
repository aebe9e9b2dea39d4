"""Builders for the policy tables: one service, one profile, round numbers.

The profile gives, for the SLO below (TTFT p95 1,800 ms, ITL p95 50 ms, maxKvCacheUsage 0.8):
- prefill: 10,000 prompt tok/s; a lone 1,000-token prompt takes 20 + 0.1 x 1000 = 120 ms, so
  the usable share is 1 - ln 20 x 120/1800 = 0.8003 and a replica plans for 8,003 prompt tok/s
  (8,000 in the tables' arithmetic: no row sits within 0.04% of a boundary);
- decode: ITL p95 reaches 50 ms at 64 streams, so 64 streams per replica; KV 200,000 tokens x
  0.8 = 160,000 tokens per replica (133 streams of 1,000 + 200 tokens: concurrency binds first);
- Little's law: a request of 200 output tokens decodes for 200 x 50 ms = 10 s, so a pool
  receiving r requests/s holds 10 r streams.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from llmfleet.autoscaler import PoolInputs, PoolPods, PoolSignals, ServiceInputs
from llmfleet.core.capacity_profile import (
    CapacityProfile,
    ItlPoint,
    MaxConcurrency,
    TtftFit,
    TtftPoint,
)
from llmfleet.crds.inference_service import InferenceServiceSpec

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _itl(concurrency: int, p95_ms: float) -> ItlPoint:
    return ItlPoint(
        concurrency=concurrency,
        p50_ms=p95_ms * 0.8,
        p95_ms=p95_ms,
        ttft_p50_ms=50.0,
        output_tokens_per_second=concurrency * 1000.0 / p95_ms,
        samples=100,
    )


PROFILE = CapacityProfile(
    url="http://engine:8000",
    model="test/model",
    measured_at="2026-01-01T00:00:00Z",
    output_tokens=200,
    ttft=[
        TtftPoint(
            prompt_tokens=n,
            requested_tokens=n,
            p50_ms=20 + 0.1 * n,
            p95_ms=25 + 0.1 * n,
            samples=10,
        )
        for n in (100, 1000, 4000)
    ],
    ttft_fit=TtftFit(intercept_ms=20.0, ms_per_prompt_token=0.1),
    prefill_tokens_per_second=10_000.0,
    itl=[_itl(1, 10.0), _itl(32, 30.0), _itl(64, 50.0), _itl(128, 90.0)],
    decode_step_ms=8.0,
    max_concurrency=MaxConcurrency(value=128, limited_by="queueing", tested_up_to=256),
    kv_cache_tokens=200_000,
)


def spec(
    *,
    mode: str = "Unified",
    pools: dict[str, dict[str, Any]] | None = None,
    warm_spares: int = 0,
    gpu_budget: int | None = None,
    gpus_per_pod: int = 1,
    window: int = 300,
) -> InferenceServiceSpec:
    names = ("unified",) if mode == "Unified" else ("prefill", "decode")
    topology: dict[str, Any] = {"mode": mode}
    for name in names:
        # minReplicas 1 unless a row says otherwise: the tables size load, and `floor` (the
        # policy's own floor when it is unset) has a table of its own.
        topology[name] = {"replicas": 1, "minReplicas": 1, **(pools or {}).get(name, {})}
    if mode != "Unified":
        topology["kvTransfer"] = {"connector": "NixlConnector"}
    autoscaling: dict[str, Any] = {
        "enabled": True,
        "warmSpares": warm_spares,
        "scaleDownStabilizationSeconds": window,
    }
    if gpu_budget is not None:
        autoscaling["gpuBudget"] = gpu_budget
    return InferenceServiceSpec.model_validate(
        {
            "model": {"name": "test/model"},
            "runtime": {"gpu": {"type": "H100", "count": gpus_per_pod}},
            "topology": topology,
            "slo": {"ttftP95Ms": 1800, "itlP95Ms": 50, "maxKvCacheUsage": 0.8},
            "autoscaling": autoscaling,
        }
    )


def signals(
    rate: float,
    *,
    prompt: float = 1000.0,
    output: float = 200.0,
    seconds: float = 0.0,
    **extra: Any,
) -> PoolSignals:
    """Load of `rate` requests/s of `prompt` + `output` tokens, sampled at T0 + seconds."""
    return PoolSignals(
        observed_at=at(seconds),
        request_rate=rate,
        prompt_tokens_rate=rate * prompt,
        mean_prompt_tokens=prompt,
        mean_output_tokens=output,
        **extra,
    )


def pool(
    active: int,
    load: PoolSignals | None,
    *,
    spares: int = 0,
    starting: int = 0,
    unschedulable: int = 0,
    ready_spares: int | None = None,
    profile: CapacityProfile | None = PROFILE,
) -> PoolInputs:
    """`active` pods of which `starting` are not Ready yet, and `spares` warm spares, all Ready
    unless `ready_spares` says how many are."""
    return PoolInputs(
        pods=PoolPods(
            active=active,
            spares=spares,
            ready=active - starting,
            starting=starting,
            unschedulable=unschedulable,
            ready_spares=spares if ready_spares is None else ready_spares,
        ),
        signals=load,
        profile=profile,
    )


def inputs(service: InferenceServiceSpec, **pools: PoolInputs) -> ServiceInputs:
    return ServiceInputs(spec=service, pools=pools)
