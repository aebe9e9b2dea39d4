"""When a service's loop runs a pass (pure: the time and the chance are passed in).

A pass runs when something woke the loop (a change to the service, seen by kopf's watch, or to
one of its pods or children, seen by `watched.py`), when the last pass asked to look again (its
`requeue`: a drain ends, pods start, a canary's analysis or progress deadline comes, a refused
child's back-off ends, MetricsMissing turns True: every state that changes with time alone
returns one), or when the service's full resync is due. A loop that nothing woke looks every
`resync_seconds` whether its full resync is due, and otherwise runs nothing: an idle operator's
CPU grows with the changes it sees, not with services x time (issue 28).

The full resync, every `full_resync_seconds` at the most, is the safety net. A pass reads the
watches' memory, so it cannot undo a watch event that memory lost (the informer's relist on 410
does); what it catches is what reaches no wake-up: an input nothing watches (the ServiceMonitor
CRD being installed; nodes and EndpointSlices are read only while a pass requeues anyway), a
wake-up lost between threads, a time-based state whose pass forgot its requeue. The trade-off:
such a miss lasts up to `full_resync_seconds` instead of `resync_seconds`, for a pass per
service per `full_resync_seconds` instead of one per `resync_seconds`. Each due time is drawn in
[1/2, 1] x `full_resync_seconds` after the service's last pass (any pass compares everything a
full one does), so services that started together do not pass together.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Pacing:
    """One service loop's pacing; times in seconds on one monotonic clock (the event loop's)."""

    resync_seconds: float
    full_resync_seconds: float
    chance: Callable[[], float] = random.random
    """Draws in [0, 1): spreads the full resyncs."""
    full_due: float = 0.0
    """When the next full resync is due (set by `ran`: a loop's first pass runs anyway)."""

    def ran(self, now: float) -> None:
        """A pass ended at `now`: the next full resync comes [1/2, 1] x the period later."""
        self.full_due = now + self.full_resync_seconds * (1 + self.chance()) / 2

    def timeout(self, requeue: float | None) -> float:
        """How long to wait for a wake-up after a pass that asked for `requeue`."""
        return requeue if requeue is not None else self.resync_seconds

    def due(self, *, woken: bool, requeue: float | None, now: float) -> bool:
        """Whether the wait that ended at `now` runs a pass: something woke the loop, the last
        pass's requeue came (the wait lasted that long), or the full resync is due; not when
        only the resync period ran out."""
        return woken or requeue is not None or now >= self.full_due
