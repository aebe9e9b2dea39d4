"""Scorer `least-loaded`: prefer endpoints with the fewest requests, the comparison profile.

    l_i     = max(in_flight_i, running_i) + waiting_i
    score_i = 1 - l_i / max_j l_j          (1 for all when every l is 0)

`in_flight` is current, `running`/`waiting` lag by one scrape; the larger of the first two
counts requests other gateways sent too.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmfleet.gateway.routing.base import Candidate, RoutingRequest, relative_headroom


class LeastLoadedScorer:
    def score(self, request: RoutingRequest, candidates: Sequence[Candidate]) -> list[float]:
        return relative_headroom(
            [max(float(c.in_flight), c.running) + c.waiting for c in candidates]
        )
