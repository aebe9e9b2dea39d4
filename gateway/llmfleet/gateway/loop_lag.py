"""How late the event loop runs what is due: the time every request waits before any of its
own work starts, when something holds the loop (a long synchronous step, a large JSON parse, the
GIL held by a worker thread rebuilding discovery's snapshot).

`LoopLag` sleeps a short tick, again and again, and observes how much later than asked each
sleep returned: an idle, healthy loop observes well under a millisecond. Only a sleep that
overruns is real lag; a gauge keeps the largest seen since start, the figure a benchmark or an
alert compares to its bound.
"""

from __future__ import annotations

import asyncio
from typing import Any

from llmfleet.core.tasks import cancel_and_wait

TICK_SECONDS = 0.05
"""How often the loop is sampled: a hold shorter than this can fall between two samples."""


class LoopLag:
    """Samples the running loop's lag into `histogram` (and its largest into `largest`)."""

    def __init__(self, histogram: Any, largest: Any, tick: float = TICK_SECONDS) -> None:
        self._histogram, self._largest, self._tick = histogram, largest, tick
        self._task: asyncio.Task[None] | None = None
        self.max_seconds = 0.0

    async def _sample(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            asked = loop.time() + self._tick
            await asyncio.sleep(self._tick)
            lag = max(0.0, loop.time() - asked)
            self._histogram.observe(lag)
            if lag > self.max_seconds:
                self.max_seconds = lag
                self._largest.set(lag)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._sample())

    @classmethod
    def started(cls, histogram: Any, largest: Any, tick: float = TICK_SECONDS) -> LoopLag:
        """A sampler already running on the current loop."""
        lag = cls(histogram, largest, tick)
        lag.start()
        return lag

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
