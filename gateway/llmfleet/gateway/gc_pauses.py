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

`PauseRecorder` times every collection through `gc.callbacks` into a histogram by generation.
Callbacks are process-wide: each recorder removes its own on `stop`.
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


class PauseRecorder:
    """Observes each collection's duration into `histogram.labels(generation)`."""

    def __init__(self, histogram: Any) -> None:
        self._children = [histogram.labels(str(generation)) for generation in range(3)]
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self._children[info["generation"]].observe(time.perf_counter() - self._started)

    def start(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def stop(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)
