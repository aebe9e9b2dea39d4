"""Scorer `kv-cache`: prefer endpoints with free KV cache.

    score_i = 1 - kv_usage_i               (kv_usage from `vllm:kv_cache_usage_perc`, 0-1)

An absolute score, not relative: two endpoints at 90 % are both nearly full, and the weight of
this scorer should then not be spent telling them apart.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmfleet.gateway.routing.base import Candidate, RoutingRequest


class KvCacheScorer:
    def score(self, request: RoutingRequest, candidates: Sequence[Candidate]) -> list[float]:
        return [1.0 - c.kv_usage for c in candidates]
