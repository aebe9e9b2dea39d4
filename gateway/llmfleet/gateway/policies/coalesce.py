"""`traffic.coalesce`: identical requests of one tenant share one upstream call.

- Which requests are identical is `coalesce_key` (the canonical body, the tenant, and the
  session for requests that sample without a seed; see its docstring).
- A request whose key has a call in flight joins it (`how=in_flight`); otherwise it starts
  one (`Flight`). Non-streaming callers get the same body; streaming callers each read the one
  upstream stream from its first chunk, at their own pace (see `coalesce_flight`).
- `windowMs > 0`: a good answer that finished (a 2xx body, or a whole stream's chunks) answers
  identical requests for that long (`how=window`). At most `coalesce_window_entries` answers are
  kept, over all services; expired ones are dropped as new ones arrive (oldest first) and when
  looked up.
- Each coalesced request counts in `llmfleet_gateway_coalesced{how}` and logs one line with its
  request id and the leader's; the leader's upstream call carries the leader's request id.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

from starlette.responses import Response

from llmfleet.gateway.policies.base import Handler, PolicyDeps
from llmfleet.gateway.policies.coalesce_flight import Flight
from llmfleet.gateway.policies.coalesce_key import coalesce_key
from llmfleet.gateway.proxy import Call

log = logging.getLogger("llmfleet.gateway.policies")


class Coalescer:
    def __init__(self, deps: PolicyDeps) -> None:
        self.deps = deps
        self._flights: dict[str, Flight] = {}
        self._kept: OrderedDict[str, tuple[float, Flight]] = OrderedDict()
        """Finished answers still valid within their window: key -> (expiry, flight)."""

    async def __call__(self, call: Call, next: Handler) -> Response:
        spec = call.service.traffic.coalesce
        if not spec.enabled:
            return await next(call)
        key = coalesce_key(
            call.parsed.body,
            path=call.path,
            tenant=call.tenant,
            session=call.session,
            priority=call.priority,
            headers=call.headers,
        )
        if key is None:  # sampled without a seed, and nothing says whose session it is
            return await next(call)
        how = "window"
        flight = self._recall(key)
        if flight is None:
            how = "in_flight"
            flight = self._flights.get(key)
        if flight is None:
            flight = Flight(
                key,
                call,
                next,
                window=spec.window_ms / 1000,
                max_lag=self.deps.settings.coalesce_max_lag_chunks,
                ended=self._ended,
                dropped=self._dropped,
            )
            self._flights[key] = flight
            return await flight.answer(call, coalesced=False)
        self.deps.metrics.policies.coalesced.labels(*call.policy_labels(), how).inc()
        log.info(
            "request_id=%s coalesced (%s) with leader request_id=%s",
            call.request_id,
            how,
            flight.leader,
        )
        return await flight.answer(call, coalesced=True)

    def _ended(self, flight: Flight) -> None:
        """The flight's answer is complete (or abandoned): no one joins it any more; a good
        answer is kept for its window."""
        if self._flights.get(flight.key) is flight:
            del self._flights[flight.key]
        if flight.window <= 0 or not self.deps.settings.coalesce_window_entries:
            return
        if flight.reusable():
            self._kept[flight.key] = (self.deps.clock() + flight.window, flight)
            self._kept.move_to_end(flight.key)
            self._prune()

    def _recall(self, key: str) -> Flight | None:
        kept = self._kept.get(key)
        if kept is None:
            return None
        expires, flight = kept
        if expires <= self.deps.clock():
            del self._kept[key]
            return None
        return flight

    def _prune(self) -> None:
        """Drop expired answers from the oldest on, and the oldest beyond the bound."""
        now = self.deps.clock()
        limit = self.deps.settings.coalesce_window_entries
        while self._kept:
            key, (expires, _) = next(iter(self._kept.items()))
            if expires > now and len(self._kept) <= limit:
                break
            del self._kept[key]

    def _dropped(self, call: Call) -> None:
        self.deps.metrics.policies.coalesce_dropped.labels(*call.policy_labels()).inc()
        log.warning(
            "request_id=%s dropped from a coalesced stream: more than %d chunks behind",
            call.request_id,
            self.deps.settings.coalesce_max_lag_chunks,
        )
