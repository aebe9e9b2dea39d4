"""What the autoscaling policy reads and what it remembers between decisions.

Plain frozen dataclasses, built by the signals layer in production and by the simulator or a
test table elsewhere. Rates are per second, latencies milliseconds, times timezone-aware.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime

from llmfleet.autoscaler.goodput import LatencyHistogram
from llmfleet.core.capacity_profile import CapacityProfile
from llmfleet.crds.inference_service import InferenceServiceSpec


@dataclass(frozen=True)
class PolicyConfig:
    """Knobs of the policy that the InferenceService does not carry."""

    stale_after_s: float = 60.0
    """Signals older than this are stale: the pool holds its counts (fail-static). Four
    Prometheus scrapes at the common 15 s interval."""
    short_ewma_s: float = 30.0
    """Time constant of the fast request-rate average."""
    long_ewma_s: float = 300.0
    """Time constant of the slow request-rate average (as long as the default scale-down
    stabilisation window)."""
    burst_factor: float = 1.5
    """A burst: the fast average above `burst_factor` x the slow one."""
    horizon_s: float = 60.0
    """How far ahead the forecast looks: about the time a new pod needs to serve."""
    max_growth: float = 4.0
    """The forecast scales the current load by at most this factor."""
    latency_quantile: float = 0.95
    """The percentile the SLO's TTFT and ITL targets hold for (0.99: 99% of requests within
    them; the CRD's fields are named after the default). The sizing model plans its queueing
    headroom for it; the correction still learns from observed p95s (`policy._latencies`)."""
    default_utilization: float = 0.8
    """Share of a replica's prefill throughput to plan for when there is no TTFT target."""
    min_correction: float = 0.5
    """Lowest factor observed latency may scale a replica's profiled capacity by."""
    comfortable_latency: float = 0.6
    """Observed p95 latency below this share of its target lets the correction recover; between
    it and the target the correction holds."""
    correction_recovery_s: float = 600.0
    """Time constant of the correction's recovery towards 1.0 while latency is comfortable."""
    unset_min_replicas: int = 2
    """Floor of a pool whose minReplicas is unset until its load is measured light (`floor`):
    two serving pods, so one pod's failure or a first burst meets a serving replica."""
    light_after_s: float = 1800.0
    """A pool with minReplicas unset is light, and its floor 1, once no decision has needed
    `unset_min_replicas` for this long and for twice the longest lull between two that did."""
    promote_waiting: float = 1.0
    """Requests queued in a pool's engines (all pods together) at which a fast pass promotes
    one of its Ready warm spares (`promote.py`): an engine queues only once its batch or its KV
    cache is full, so one queued request already says the serving pods are short."""
    goodput_z: float = 1.645
    """One-sided z of the Wilson bound a goodput share must clear before it cuts the correction
    (1.645: 95% confidence that more than the allowed share missed; `goodput.py`)."""


@dataclass(frozen=True)
class PoolSignals:
    """Load and latency of one pool, as the signals layer measured it."""

    observed_at: datetime
    """When the newest sample was taken; older than `stale_after_s` means stale."""
    request_rate: float
    """Requests per second entering the pool."""
    prompt_tokens_rate: float
    """Prompt tokens per second the pool has to prefill."""
    mean_prompt_tokens: float
    mean_output_tokens: float
    running: float = 0.0
    """Requests decoding now, all pods together."""
    waiting: float = 0.0
    """Requests queued in the engines, all pods together."""
    kv_cache_usage: float | None = None
    """Mean KV-cache usage (0 to 1) over the ready pods."""
    ttft_p95_ms: float | None = None
    itl_p95_ms: float | None = None
    preemption_rate: float | None = None
    """Preemptions per second (KV cache full), all pods together; None when not exported."""
    gpu_utilization: float | None = None
    """Mean GPU utilisation (0 to 1) over the pool's GPUs where DCGM is scraped, else None."""
    peak_prompt_tokens_rate: float | None = None
    """The highest prompt-token rate over short sub-windows of the rate window (None when not
    measured): traffic that arrives in bursts of seconds needs prefill for the bursts, which
    the window's mean hides."""
    ttft_histogram: LatencyHistogram | None = None
    """Requests of the rate window by TTFT (seconds, cumulative buckets); None when not
    exported. The goodput the correction learns from (`goodput.py`)."""
    itl_histogram: LatencyHistogram | None = None
    """Requests of the rate window by their mean inter-token latency (seconds), or token gaps
    where the engine exports no per-request histogram (`signals.py`); None when not exported."""
    prefill_histogram: LatencyHistogram | None = None
    """Requests of the rate window by the time their prefill phase took (seconds): TTFT misses
    a prompt's own length causes (`goodput.capacity_misses`); None when not exported."""

    def invalid(self) -> str:
        """The fields that are no number a load can have (NaN from a quantile over no samples,
        negative from a counter reset mid-rate), or "" when all are usable."""
        values = {
            "request_rate": self.request_rate,
            "prompt_tokens_rate": self.prompt_tokens_rate,
            "mean_prompt_tokens": self.mean_prompt_tokens,
            "mean_output_tokens": self.mean_output_tokens,
            "running": self.running,
            "waiting": self.waiting,
            "kv_cache_usage": self.kv_cache_usage,
            "ttft_p95_ms": self.ttft_p95_ms,
            "itl_p95_ms": self.itl_p95_ms,
            "preemption_rate": self.preemption_rate,
            "gpu_utilization": self.gpu_utilization,
            "peak_prompt_tokens_rate": self.peak_prompt_tokens_rate,
        }
        bad = [
            f"{name} = {value}"
            for name, value in values.items()
            if value is not None and not (math.isfinite(value) and value >= 0)
        ]
        histograms = (
            ("ttft", self.ttft_histogram),
            ("itl", self.itl_histogram),
            ("prefill", self.prefill_histogram),
        )
        for name, histogram in histograms:
            why = histogram.invalid() if histogram is not None else ""
            if why:
                bad.append(f"{name}_histogram {why}")
        return ", ".join(bad)


@dataclass(frozen=True)
class PoolPods:
    """The pool's pods as the Kubernetes API shows them."""

    active: int
    """Serving replicas the pool is running towards now (the last decision, or the spec)."""
    spares: int = 0
    """Warm spares it is running towards now."""
    ready: int = 0
    starting: int = 0
    """Scheduled or schedulable pods that are not Ready yet: capacity to come."""
    unschedulable: int = 0
    """Pending pods the scheduler could not place (no node has the GPUs)."""
    ready_spares: int = 0
    """Ready pods out of traffic (warm spares, or pods still draining): what a promotion can
    put into service at once (`promote.py`)."""


@dataclass(frozen=True)
class PoolInputs:
    pods: PoolPods
    signals: PoolSignals | None
    """None when the metrics are missing."""
    profile: CapacityProfile | None = None
    """The pool's measured capacity profile; per-GPU defaults when None."""
    missing: str = ""
    """Why `signals` is None when the caller knows (the metrics backend could not be asked);
    empty means no series exist for the pool."""


@dataclass(frozen=True)
class ServiceInputs:
    spec: InferenceServiceSpec
    pools: dict[str, PoolInputs]
    """Keyed by pool name (`unified`, or `prefill` and `decode`), as `spec.pools()`."""


@dataclass(frozen=True)
class PoolState:
    """What the policy remembers about one pool between decisions."""

    updated_at: datetime | None = None
    short_rate: float = 0.0
    long_rate: float = 0.0
    correction: float = 1.0
    """Factor on the profiled per-replica capacity, learnt from observed latency."""
    low_since: datetime | None = None
    """Since when the pool's need has stayed below its current count."""
    low_peak: int = 0
    """Highest need seen since `low_since`: where a scale-down may go."""
    observed_since: datetime | None = None
    """First signals the policy sized this pool from (`floor`: how long it has watched)."""
    busy_at: datetime | None = None
    """Last signals whose need reached `PolicyConfig.unset_min_replicas`."""
    longest_lull_s: float = 0.0
    """Longest time between two such needs: how long this pool's bursts can stay away."""


@dataclass(frozen=True)
class PolicyState:
    pools: dict[str, PoolState] = field(default_factory=dict)

    def pool(self, name: str) -> PoolState:
        return self.pools.get(name, PoolState())
