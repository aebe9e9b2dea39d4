"""Which engines to scrape now: a pure function of what routing read, when, and what is due.

The scraper's cost follows traffic, not fleet size. An endpoint is *active* while routing read
its figures within `active_seconds` (`EndpointTable.reads`: every candidate of a routing
decision, and the serving pool of an admission check, so a pool with traffic is active as a
whole); only active endpoints are scraped, each once per interval. An endpoint that goes idle
is dropped from the schedule and forgets its figures, so an idle pool costs no GET at all.

Each tick the scraper asks `plan` which scrapes to start:

- `idle`: endpoints whose last read is older than `active_seconds` (the scraper forgets them);
- `start`: active endpoints not being scraped whose next scrape is due (never scraped: due at
  once), most overdue first, at most `slots` of them (the scrapes in flight are bounded, so
  scrapes are spread over the interval instead of bursting: what does not fit waits a tick).

Inputs (all times on one monotonic clock, seconds):

- `reads`: endpoint URL -> the last time routing read its figures;
- `due`: endpoint URL -> when its next scrape is due (absent: never scraped since it became
  active: due now, ahead of every scheduled one);
- `busy`: endpoints with a scrape in flight (never started twice).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class ScrapePlan:
    start: tuple[str, ...] = ()
    """Scrape these now, in this order (the most overdue first)."""
    idle: tuple[str, ...] = ()
    """No routing read within the active window: forget them (no more scrapes, no figures)."""


def plan(
    reads: Mapping[str, float],
    due: Mapping[str, float],
    busy: Collection[str],
    now: float,
    *,
    active_seconds: float,
    slots: int,
) -> ScrapePlan:
    """The scrapes to start at `now` and the endpoints that went idle (see the module)."""
    idle: list[str] = []
    ready: list[tuple[float, str]] = []
    since = now - active_seconds
    for url, read in reads.items():
        if read < since:
            idle.append(url)
            continue
        when = due.get(url, -math.inf)
        if when <= now and url not in busy:
            ready.append((when, url))
    ready.sort()
    return ScrapePlan(tuple(url for _, url in ready[: max(slots, 0)]), tuple(sorted(idle)))


def next_due(started: float, interval: float, jitter: float, draw: float) -> float:
    """When an endpoint whose scrape started at `started` is due again: one `interval` later,
    moved by up to ±`jitter`/2 of it (`draw` in [0, 1)), so the endpoints of a pool that
    became active together drift apart instead of being scraped in one burst forever."""
    return started + interval * (1.0 + jitter * (draw - 0.5))
