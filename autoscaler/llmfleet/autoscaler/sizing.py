"""How many serving replicas a pool needs for a forecast load, and why.

- prefill: prompt tokens/s against per-replica prefill throughput at the utilisation the TTFT
  target allows (`capacity.prefill_utilization`); the demand is the window's mean rate, or the
  peak short-window rate inside the window when that is higher (traffic that comes in bursts of
  seconds needs prefill for the bursts), scaled by the forecast;
- decode: concurrent streams against the concurrency at the ITL target, and KV tokens against
  `maxKvCacheUsage` of the replica's KV cache (the larger of the two);
- unified: both, the larger.

Load figures are scaled by growth = forecast rate / current rate, so a forecast rise sizes
every dimension alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmfleet.autoscaler.capacity import (
    ReplicaCapacity,
    concurrency_at_itl,
    prefill_utilization,
)
from llmfleet.autoscaler.inputs import PolicyConfig, PoolSignals
from llmfleet.crds.spec import SloSpec

_EPSILON = 1e-9
_CEILING = 1e9
"""Replicas no pool can need; caps absurd ratios before they reach int()."""


def _ceil(x: float) -> int:
    """Ceiling that forgives float noise (2.0000000001 replicas is 2)."""
    return max(math.ceil(min(x, _CEILING) - _EPSILON), 0)


@dataclass(frozen=True)
class Need:
    replicas: int
    why: str
    """Which demand set the count, with its figures (part of the reason string)."""


def prefill_need(
    signals: PoolSignals,
    *,
    growth: float,
    capacity: ReplicaCapacity,
    correction: float,
    slo: SloSpec,
    config: PolicyConfig,
) -> Need:
    demand = signals.prompt_tokens_rate * growth
    peak = signals.peak_prompt_tokens_rate
    source = "prompt tok/s"
    if peak is not None and peak * growth > demand:
        demand, source = peak * growth, "prompt tok/s at the window's peak"
    # The queue is prompt tokens already owed: clearing them within the TTFT target adds their
    # count over the target to what arrives (the rates cannot show it: prefilled tokens are
    # counted once prefilled, so a saturated pool's rate is its capacity, not its load).
    if signals.waiting > 0 and slo.ttft_p95_ms is not None:
        backlog = signals.waiting * signals.mean_prompt_tokens / (slo.ttft_p95_ms / 1000.0)
        demand += backlog
        source += f" + {backlog:.0f} for the {signals.waiting:.0f} queued requests"
    utilization = prefill_utilization(
        capacity,
        signals.mean_prompt_tokens,
        slo.ttft_p95_ms,
        config.default_utilization,
        config.latency_quantile,
    )
    per_replica = capacity.prefill_tokens_per_second * utilization * correction
    replicas = _ceil(demand / per_replica)
    return Need(
        replicas,
        f"prefill {demand:.0f} {source} at {per_replica:.0f} tok/s per replica "
        f"({capacity.source}, {utilization:.0%} utilisation for the TTFT "
        f"p{100 * config.latency_quantile:g} target, "
        f"correction {correction:.2f})",
    )


def decode_need(
    signals: PoolSignals,
    *,
    growth: float,
    ready: int,
    capacity: ReplicaCapacity,
    correction: float,
    slo: SloSpec,
) -> Need:
    # Little's law: a request decodes for mean_output x ITL seconds, at the ITL target.
    itl_s = (slo.itl_p95_ms or 50.0) / 1000.0
    little = signals.request_rate * growth * signals.mean_output_tokens * itl_s
    observed = (signals.running + signals.waiting) * growth
    concurrency = max(little, observed)
    per_replica = concurrency_at_itl(capacity, slo.itl_p95_ms) * correction
    by_concurrency = _ceil(concurrency / per_replica)

    # A stream holds up to its whole context in KV cache near its end: size for that.
    tokens = concurrency * (signals.mean_prompt_tokens + signals.mean_output_tokens)
    # NOTE: a GPU whose memory the weights fill leaves no KV cache: one token keeps the division
    # defined and asks for every replica the budget and maxReplicas allow.
    kv_per_replica = max(capacity.kv_cache_tokens, 1.0) * slo.max_kv_cache_usage
    by_kv = _ceil(tokens / kv_per_replica)
    by_usage = 0
    if signals.kv_cache_usage is not None and ready > 0:
        by_usage = _ceil(ready * signals.kv_cache_usage * growth / slo.max_kv_cache_usage)

    replicas = max(by_concurrency, by_kv, by_usage)
    if replicas == by_concurrency:
        why = (
            f"decode {concurrency:.0f} concurrent streams at {per_replica:.0f} per replica "
            f"within the ITL target ({capacity.source}, correction {correction:.2f})"
        )
    elif replicas == by_kv:
        why = (
            f"decode KV demand {tokens:.0f} tokens at {kv_per_replica:.0f} per replica "
            f"(maxKvCacheUsage {slo.max_kv_cache_usage:.2f})"
        )
    else:
        why = (
            f"decode KV-cache usage {signals.kv_cache_usage:.0%} on {ready} ready pods "
            f"above maxKvCacheUsage {slo.max_kv_cache_usage:.0%}"
        )
    return Need(replicas, why)
