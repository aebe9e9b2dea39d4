"""llmfleet's own policy in the simulator: the production `decide` on signals built from the
simulated engines, with the engine's capacity profile and warm spares from the spec, and the
policy knobs production reads from the autoscaler's settings (`compare` sets the latency
percentile to the experiment's goal and the forecast horizon to the engine's cold start)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from llmfleet.autoscaler.inputs import (
    PolicyConfig,
    PolicyState,
    PoolInputs,
    PoolPods,
    PoolSignals,
    ServiceInputs,
)
from llmfleet.autoscaler.policy import decide, decide_fast
from llmfleet.autoscaler.sim.observe import Observation
from llmfleet.core.capacity_profile import CapacityProfile
from llmfleet.crds.inference_service import InferenceServiceSpec

T0 = datetime(2026, 1, 1, tzinfo=UTC)
"""Simulated second 0 as the policy's wall clock."""
FAST_INTERVAL_S = 5.0
"""The fast pass's period. Production's default is 2 s (`AutoscalerSettings
.fast_interval_seconds`) on gauges as old as the engines' scrape (15 s with the chart's
ServiceMonitor); the simulator's fast look reads the engines' gauges of that very moment, so a
look every 5 s stands for production's fresher cadence on staler gauges."""


def service_spec(
    *,
    ttft_ms: float,
    itl_ms: float,
    initial: int,
    min_replicas: int | None = 1,
    max_replicas: int,
    warm_spares: int,
    window_s: int = 300,
    max_kv_cache_usage: float = 0.85,
) -> InferenceServiceSpec:
    """The InferenceService a user would write for this pool."""
    return InferenceServiceSpec.model_validate(
        {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
            "runtime": {"gpu": {"type": "H100", "count": 1}},
            "topology": {
                "mode": "Unified",
                "unified": {
                    "replicas": max(initial, min_replicas or 1),
                    "minReplicas": min_replicas,
                    "maxReplicas": max_replicas,
                },
            },
            "slo": {
                "ttftP95Ms": ttft_ms,
                "itlP95Ms": itl_ms,
                "maxKvCacheUsage": max_kv_cache_usage,
            },
            "autoscaling": {
                "enabled": True,
                "warmSpares": warm_spares,
                "scaleDownStabilizationSeconds": window_s,
            },
        }
    )


class OurPolicy:
    name: str
    """"llmfleet", or the name of a second run beside it (`compare.ours_beside`)."""

    def __init__(
        self,
        spec: InferenceServiceSpec,
        profile: CapacityProfile,
        config: PolicyConfig | None = None,
        *,
        fast_interval_s: float = FAST_INTERVAL_S,
        name: str = "llmfleet",
    ) -> None:
        self.name = name
        self.spec = spec
        self.profile = profile
        self.config = config or PolicyConfig()
        self.state = PolicyState()
        self.fast_interval_s = fast_interval_s
        self._signals: PoolSignals | None = None

    def start(self) -> tuple[int, int]:
        pool = self.spec.pools()["unified"]
        return pool.replicas, self.spec.autoscaling.warm_spares

    def decide(self, observation: Observation) -> tuple[int, int]:
        now = T0 + timedelta(seconds=observation.now)
        signals = PoolSignals(
            observed_at=now,
            request_rate=observation.request_rate,
            prompt_tokens_rate=observation.prompt_tokens_rate,
            mean_prompt_tokens=observation.mean_prompt_tokens,
            mean_output_tokens=observation.mean_output_tokens,
            running=observation.running,
            waiting=observation.waiting,
            kv_cache_usage=observation.kv_cache_usage,
            ttft_p95_ms=observation.ttft_p95_ms,
            itl_p95_ms=observation.itl_p95_ms,
            peak_prompt_tokens_rate=observation.peak_prompt_tokens_rate,
            ttft_histogram=observation.ttft_histogram,
            itl_histogram=observation.itl_histogram,
            prefill_histogram=observation.prefill_histogram,
        )
        self._signals = signals
        decision = decide(self._inputs(signals, observation), self.state, now, self.config)
        self.state = decision.state
        pool = decision.pools["unified"]
        return pool.active, pool.spares

    def decide_fast(self, observation: Observation) -> tuple[int, int]:
        """The fast pass: the last full tick's rates and latencies with this moment's gauges;
        a queue promotes a loaded spare as in production (`promote.py`)."""
        if self._signals is None:
            return observation.active, observation.spares
        now = T0 + timedelta(seconds=observation.now)
        signals = replace(
            self._signals,
            running=observation.running,
            waiting=observation.waiting,
            kv_cache_usage=observation.kv_cache_usage,
        )
        decision = decide_fast(self._inputs(signals, observation), self.state, now, self.config)
        pool = decision.pools["unified"]
        return pool.active, pool.spares

    def _inputs(self, signals: PoolSignals, observation: Observation) -> ServiceInputs:
        pods = PoolPods(
            active=observation.active,
            spares=observation.spares,
            ready=observation.ready,
            starting=observation.starting,
            ready_spares=observation.ready_spares,
        )
        return ServiceInputs(self.spec, {"unified": PoolInputs(pods, signals, self.profile)})
