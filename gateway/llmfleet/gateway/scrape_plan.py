"""Which engines to scrape now: a schedule of the active endpoints, in due order.

The scraper's cost follows traffic, not fleet size. An endpoint is *active* while routing read
its figures within `active_seconds` (`EndpointTable.reads`: every candidate of a routing
decision, and the serving pool of an admission check, so a pool with traffic is active as a
whole). Routing's first read of an endpoint *arrives* it here (`EndpointTable.arrived`); from
then on the endpoint has exactly one place in a heap ordered by when it is next due.

Each tick the scraper calls `Schedule.take`, which looks only at the endpoints due now:

- one that went idle (no read within `active_seconds`) leaves the schedule, and the scraper
  forgets its figures, so an idle pool costs nothing at all;
- one that is *cold*, not read since its last scrape started (routing reads its pool less than
  once an interval), is not scraped: figures read that rarely are mostly older than the
  staleness bound when read, and routing then goes on its own in-flight counts anyway
  (`llmfleet sim --scrape-seconds` measured figures 5-15 s old worse than none). It is looked
  at again an interval later, and scraped at its first due time after a read;
- the others are scraped, newly arrived first, then the most overdue, at most `slots` (the
  scrapes in flight are bounded) and at most `per_second` a second on average (a token
  bucket): what does not fit waits, most overdue first.

So a tick costs O(due endpoints * log active), not O(active): at 10,000 active endpoints the
old walk of every one of them took ~20 ms a tick, on the event loop, 20 times a second.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class ScrapePlan:
    start: tuple[str, ...] = ()
    """Scrape these now, in this order (newly arrived first, then the most overdue)."""
    idle: tuple[str, ...] = ()
    """No routing read within the active window: forget them (no more scrapes, no figures)."""
    late: tuple[float, ...] = ()
    """How late each scheduled start of `start` is past its due time (arrivals have none)."""


class Schedule:
    """The active endpoints and when each is due (see the module). Pure: no clock, no I/O;
    `draw` gives the jitter's random numbers in [0, 1)."""

    def __init__(self, *, interval: float, active_seconds: float, per_second: float,
                 jitter: float, draw: Callable[[], float]) -> None:  # fmt: skip
        self._interval = interval
        self._active = active_seconds
        self._rate = per_second
        self._burst = max(1.0, per_second / 10)
        self._tokens = self._burst
        self._refilled: float | None = None
        self._jitter = jitter
        self._draw = draw
        self._due: dict[str, float] = {}
        """URL -> its one valid due time (a heap entry with another time is stale)."""
        self._started: dict[str, float] = {}
        """URL -> when its last scrape started."""
        self._heap: list[tuple[float, int, str]] = []
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._due)

    def arrive(self, urls: Iterable[str]) -> None:
        """Routing read these for the first time (since they were last forgotten): due now,
        ahead of every scheduled one."""
        for url in urls:
            if url not in self._due:
                self._push(url, -math.inf)

    def retain(self, known: Collection[str]) -> None:
        """Drop endpoints discovery no longer lists."""
        for url in [url for url in self._due if url not in known]:
            del self._due[url]
            self._started.pop(url, None)

    def take(self, reads: Mapping[str, float], busy: Collection[str], now: float,
             slots: int) -> ScrapePlan:  # fmt: skip
        """The scrapes to start at `now` and the endpoints that went idle."""
        if self._refilled is not None:
            self._tokens = min(self._burst, self._tokens + (now - self._refilled) * self._rate)
        self._refilled = now
        start: list[str] = []
        idle: list[str] = []
        late: list[float] = []
        heap = self._heap
        while heap and heap[0][0] <= now and len(start) < slots and self._tokens >= 1:
            due, _, url = heapq.heappop(heap)
            if self._due.get(url) != due:
                continue  # superseded by a later entry, or dropped
            read = reads.get(url)
            if read is None or read < now - self._active:
                del self._due[url]
                self._started.pop(url, None)
                if read is not None:
                    idle.append(url)
                continue
            if url in busy or read <= self._started.get(url, -math.inf):
                self._push(url, now + self._interval)  # in flight still, or cold
                continue
            start.append(url)
            self._started[url] = now
            if due > -math.inf:
                late.append(now - due)
            self._tokens -= 1
            self._push(url, next_due(now, self._interval, self._jitter, self._draw()))
        return ScrapePlan(tuple(start), tuple(sorted(idle)), tuple(late))

    def _push(self, url: str, due: float) -> None:
        self._due[url] = due
        heapq.heappush(self._heap, (due, next(self._order), url))
        if len(self._heap) > 4 * len(self._due) + 64:  # stale entries: rebuild, O(active)
            self._heap = [(d, n, u) for d, n, u in self._heap if self._due.get(u) == d]
            heapq.heapify(self._heap)


def next_due(started: float, interval: float, jitter: float, draw: float) -> float:
    """When an endpoint whose scrape started at `started` is due again: one `interval` later,
    moved by up to ±`jitter`/2 of it (`draw` in [0, 1)), so the endpoints of a pool that
    became active together drift apart instead of being scraped in one burst forever."""
    return started + interval * (1.0 + jitter * (draw - 0.5))
