"""Scorer `queue-depth`: prefer endpoints with shorter engine queues.

    q_i     = waiting_i + max(0, in_flight_i - running_i)
    score_i = 1 - q_i / max_j q_j          (1 for all when every q is 0)

`waiting` is the engine's own queue from its last scrape; `in_flight - running` adds what this
gateway sent since that the engine has not reported as running yet, so a burst between two
scrapes does not all land on the endpoint that looked idle.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmfleet.gateway.routing.base import Candidate, RoutingRequest, relative_headroom


class QueueDepthScorer:
    def score(self, request: RoutingRequest, candidates: Sequence[Candidate]) -> list[float]:
        return relative_headroom(
            [c.waiting + max(0.0, c.in_flight - c.running) for c in candidates]
        )
