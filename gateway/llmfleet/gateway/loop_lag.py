"""How late the event loop runs what is due: the time every request waits before any of its
own work starts, when something holds the loop (a long synchronous step, a large JSON parse, the
GIL held by a worker thread rebuilding discovery's snapshot).

`LoopLag` sleeps a short tick, again and again, and observes how much later than asked each
sleep returned: an idle, healthy loop observes well under a millisecond. Only a sleep that
overruns is real lag; a gauge keeps the largest seen since start, the figure a benchmark or an
alert compares to its bound.

Lag has two causes that call for different fixes: the gateway's own work holding the loop, and
the loop's thread waiting for a CPU (a node whose cores are all busy: on the 2-core benchmark
machine the load generator and the engines share them with the gateway). Linux counts the second
per thread, as run-queue wait in `/proc/thread-self/schedstat`; `CpuWait` reads it at every
sample, so each sample is also observed less all that its thread waited for a CPU since the
previous one: the `own` lag. A wait early in the interval that made no lag is subtracted too, so
own lag is a lower bound of what the gateway's work made, exact when the thread did not wait.
Where that file cannot be read (not Linux, no schedstat) own lag is the whole lag.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from llmfleet.core.tasks import cancel_and_wait

TICK_SECONDS = 0.05
"""How often the loop is sampled: a hold shorter than this can fall between two samples."""


SCHEDSTAT = "/proc/thread-self/schedstat"
"""Linux: the calling thread's time on a CPU, time waiting on a run queue (nanoseconds) and
time slices."""


class CpuWait:
    """Seconds the thread that made it has waited for a CPU so far (`waited`); None where the
    kernel does not say. Made on the thread it watches: `thread-self` is resolved at open."""

    def __init__(self, path: str = SCHEDSTAT) -> None:
        try:
            self._fd: int | None = os.open(path, os.O_RDONLY)
        except OSError:
            self._fd = None
        if self.waited() is None:
            self.close()

    def waited(self) -> float | None:
        if self._fd is None:
            return None
        try:
            fields = os.pread(self._fd, 128, 0).split()
            return int(fields[1]) / 1e9
        except (OSError, IndexError, ValueError):
            return None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class LoopLag:
    """Samples the running loop's lag into `histogram` (and its largest into `largest`); with
    `own` and `own_largest`, also the lag less the loop thread's wait for a CPU (module
    docstring), and with `cpu_wait` (a counter) that wait itself."""

    def __init__(
        self,
        histogram: Any,
        largest: Any,
        tick: float = TICK_SECONDS,
        *,
        own: Any = None,
        own_largest: Any = None,
        cpu_wait: Any = None,
    ) -> None:
        self._histogram, self._largest, self._tick = histogram, largest, tick
        self._own, self._own_largest, self._cpu_wait = own, own_largest, cpu_wait
        self._task: asyncio.Task[None] | None = None
        self.max_seconds = 0.0
        self.own_max_seconds = 0.0

    async def _sample(self) -> None:
        loop = asyncio.get_running_loop()
        cpu = CpuWait()
        waited_before = cpu.waited()
        try:
            while True:
                asked = loop.time() + self._tick
                await asyncio.sleep(self._tick)
                lag = max(0.0, loop.time() - asked)
                waited = cpu.waited()
                wait = 0.0
                if waited is not None and waited_before is not None:
                    wait = max(0.0, waited - waited_before)
                waited_before = waited
                self._observe(lag, wait)
        finally:
            cpu.close()

    def _observe(self, lag: float, wait: float) -> None:
        self._histogram.observe(lag)
        if lag > self.max_seconds:
            self.max_seconds = lag
            self._largest.set(lag)
        if self._cpu_wait is not None and wait > 0:
            self._cpu_wait.inc(wait)
        own = max(0.0, lag - wait)
        if self._own is not None:
            self._own.observe(own)
        if own > self.own_max_seconds:
            self.own_max_seconds = own
            if self._own_largest is not None:
                self._own_largest.set(own)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._sample())

    @classmethod
    def started(
        cls, histogram: Any, largest: Any, tick: float = TICK_SECONDS, **own: Any
    ) -> LoopLag:
        """A sampler already running on the current loop (`own`: see `__init__`)."""
        lag = cls(histogram, largest, tick, **own)
        lag.start()
        return lag

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
