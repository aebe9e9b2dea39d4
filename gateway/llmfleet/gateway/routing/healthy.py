"""Filter `healthy`: drop ejected endpoints, and those whose scraped figures went stale.

    keep c  iff  not c.ejected and not c.stale     (if that leaves none: not c.ejected)

A stale endpoint stays a candidate when it is all there is (its scraper may be what failed).

When every endpoint is ejected the pipeline ignores the filter's empty answer and routes to all
of them: a pool that failed as a whole is better probed by traffic than answered with 503.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmfleet.gateway.routing.base import Candidate, RoutingRequest


class HealthyFilter:
    def filter(self, request: RoutingRequest, candidates: Sequence[Candidate]) -> list[Candidate]:
        healthy = [candidate for candidate in candidates if not candidate.ejected]
        return [candidate for candidate in healthy if not candidate.stale] or healthy
