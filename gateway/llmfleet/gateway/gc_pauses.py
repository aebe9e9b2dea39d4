"""No stop-the-world pauses from the garbage collector, and the pauses there are, measured.

After start-up the gateway holds ~160k long-lived objects (FastAPI, pydantic, the Kubernetes
client, prometheus_client...). CPython's full collection walks all of them: 80-110 ms every few
seconds under load, which is the whole p99 of a proxy. `gc.freeze()` after start-up moves them
to a permanent generation the collector never walks; what is left to collect is the per-request
garbage, a few thousand objects (about 1 ms for a full collection).

The fleet the gateway discovers comes after start-up: at 300 services the discovery caches and
snapshot made full collections of ~50 ms under load (bench/control_plane_scale.py), growing with
the fleet. So the heap is frozen once more when discovery's first snapshot is in
(`became_ready`, then `freeze_startup_heap`), before traffic comes; what discovery keeps is
trimmed to what it reads (`kube_discovery.kept`), so what changes later adds few objects to
walk. Freezing is done twice and not on every change: objects frozen stay out of the cycle
collector for good (those that die are freed by reference counting, but garbage in a cycle would
stay), so a freeze is only done when there is next to no such garbage: before any request.

Each pool's routing state that lives as long as the fleet does (its scheduler and scorers, its
endpoints' states) is made for every pool of that first snapshot before the freeze
(`app.prepare_pools`). Its series come with its first request (made at start-up they would put
~45 series per pool in /metrics whether or not it serves), as two tracked objects
(`pool_metrics`): prometheus_client's children were ~120 per pool, 120k at 1,000 pools with
traffic, and with the rest of the pools' state made by first requests, full collections of it
took 100-350 ms under 600 requests/s (a static config of 1,000 x 10 engines, one stand-in
engine; the same in bench/control_plane_scale.py). What traffic makes to keep per engine is little:
open connections (an idle one holds no parser, `wire.py`), parsed URLs as untracked tuples,
scraped figures as numbers of the endpoint's state.

Pools that come later, and what else grows, are met by `Refreezer`: it freezes once more what
a full collection that took at least `refreeze_after_pause_seconds` left alive: the collection
has just removed the garbage, so little is frozen but live state, and the pauses after it walk
only what came since.
What is frozen and dies later is freed by reference counting; only what is then cyclic garbage
stays, at most the few requests in flight at the freeze, and a request leaves none
(tests/gateway/test_gc_pauses.py counts it: the request path is kept free of reference cycles,
so that traffic alone brings no full collection). Freezes come from growth (each needs
another long collection, so another such heap of new objects) and are capped at
`REFREEZES_PER_HOUR`, so a heap that keeps churning cannot turn them into a leak.

`PauseRecorder` times every collection through `gc.callbacks` into a histogram by generation,
twice: the wall time (what the loop, or the thread that collected, was held) and the CPU time
of the collecting thread (what walking the heap cost). They differ when the machine's CPUs are
busy: the thread is preempted mid-collection, and the wall time grows with the wait for a CPU
(a full collection of 2-5 ms CPU took 25-50 ms wall on the 2-core benchmark cluster). The
`Refreezer` is told each full collection's CPU time: a freeze shortens the walk, never the
wait. Callbacks are process-wide: each recorder removes its own on `stop`.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from typing import Any


def freeze_startup_heap() -> int:
    """Collect once, then freeze everything alive; returns the count of frozen objects."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


async def became_ready(
    ready: Callable[[], bool], *, every: float = 0.1, deadline: float = 300.0
) -> bool:
    """Whether `ready()` (discovery's first snapshot is in) came true within `deadline`
    seconds, checked every `every` seconds: when the heap is frozen once more."""
    loop = asyncio.get_running_loop()
    until = loop.time() + deadline
    while not ready():
        if loop.time() >= until:
            return False
        await asyncio.sleep(every)
    return True


REFREEZES_PER_HOUR = 12
"""At most this many `Refreezer` freezes in any hour (module docstring)."""


class Refreezer:
    """Freezes the heap after a full collection that took at least `after_seconds` of CPU
    (module docstring), at most `most_per_hour` times in any hour. The collector's callback only
    notes the need (`full_collection`): a callback runs wherever an allocation set off the
    collection, possibly inside the event loop's own code, so the freeze itself is done by
    `forever`, a task on the loop that looks every `every` seconds."""

    def __init__(
        self,
        after_seconds: float,
        *,
        most_per_hour: int = REFREEZES_PER_HOUR,
        on_freeze: Callable[[float], None] = lambda paused: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._after = after_seconds
        self._most = most_per_hour
        self._on_freeze = on_freeze
        self._clock = clock
        self._done: list[float] = []
        self._paused: float | None = None
        """The long full collection that asks for a freeze (seconds), until it is done."""

    def full_collection(self, seconds: float) -> None:
        if seconds >= self._after and self._paused is None:
            self._paused = seconds

    def due(self) -> bool:
        """Whether a long collection asked for a freeze and this hour's freezes allow one."""
        if self._paused is None:
            return False
        now = self._clock()
        self._done = [at for at in self._done if now - at < 3600]
        if len(self._done) >= self._most:
            self._paused = None  # the next long collection asks again
            return False
        return True

    def freeze(self) -> None:
        """Freeze everything alive now (not counted: `gc.get_freeze_count` walks every frozen
        object, as long as a full collection did before the first freeze)."""
        paused, self._paused = self._paused or 0.0, None
        self._done.append(self._clock())
        gc.freeze()
        self._on_freeze(paused)

    async def forever(self, every: float = 1.0) -> None:
        while True:
            await asyncio.sleep(every)
            if self.due():
                self.freeze()


class PauseRecorder:
    """Observes each collection's wall time into `histogram.labels(generation)` and its CPU
    time (the collecting thread's) into `cpu_histogram`; each full collection's CPU time also
    into `refreezer` (module docstring)."""

    def __init__(
        self,
        histogram: Any,
        refreezer: Refreezer | None = None,
        *,
        cpu_histogram: Any = None,
        clock: Callable[[], float] = time.perf_counter,
        cpu_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self._children = [histogram.labels(str(generation)) for generation in range(3)]
        self._cpu_children = (
            [cpu_histogram.labels(str(generation)) for generation in range(3)]
            if cpu_histogram is not None else None
        )  # fmt: skip
        self._refreezer = refreezer
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._started = 0.0
        self._cpu_started = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = self._clock()
            self._cpu_started = self._cpu_clock()
        else:
            cpu = self._cpu_clock() - self._cpu_started
            seconds = self._clock() - self._started
            generation = info["generation"]
            self._children[generation].observe(seconds)
            if self._cpu_children is not None:
                self._cpu_children[generation].observe(cpu)
            if generation == 2 and self._refreezer is not None:
                self._refreezer.full_collection(cpu)

    def start(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def stop(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)
