"""Scorer `inflight-tokens`: prefer endpoints with fewer tokens in flight from this gateway.

    score_i = 1 - t_i / max_j t_j          (t = estimated prompt + max output tokens in flight)

Request counts treat a 100k-token prompt like a 10-token one; tokens do not.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmfleet.gateway.routing.base import Candidate, RoutingRequest, relative_headroom


class InFlightTokensScorer:
    def score(self, request: RoutingRequest, candidates: Sequence[Candidate]) -> list[float]:
        return relative_headroom([float(c.in_flight_tokens) for c in candidates])
