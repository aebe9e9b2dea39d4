"""The threads reconcile passes run in, edits first.

A pass is a blocking call (`Reconciler.reconcile`); the service loops (`handlers.py`) run them
in a few threads of their own. With more passes due than threads, those of a service whose spec
was edited and not yet acted on go first, then the rest in the order they came. This matters
when a thousand are due at once: at an operator's start every service's loop runs its first
pass, and a spec edited while the operator was down (an upgrade, a rescheduled pod) waited
behind all the passes that find nothing to do (bench/control_plane_scale.py, "operator
restarted").

A pass still waiting for a thread when its loop is stopped (the operator exits, or peering
pauses it) gives up and leaves the queue (`Stopped`); one already in its thread runs to its end,
as a thread cannot be cancelled.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from prometheus_client import Gauge

T = TypeVar("T")

EDITED, OTHER = 0, 1
"""A pass's rank: lower goes first."""


class Stopped(Exception):
    """A pass gave up waiting for a thread, without running: its loop is stopping."""


def unobserved(body: Mapping[str, Any]) -> bool:
    """Whether the service's spec has a generation its status has not acted on yet (a service
    never reconciled has none acted on)."""
    generation = (body.get("metadata") or {}).get("generation")
    observed = (body.get("status") or {}).get("observedGeneration")
    return generation is not None and generation != observed


class Passes:
    """Runs passes in `workers` threads; a pass waits for a free one, the edited first, and
    `gauge` (when given) shows how many wait. Used from one event loop only."""

    def __init__(self, workers: int, gauge: Gauge | None = None) -> None:
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="reconcile")
        self._free = workers
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._pending = 0  # in `_waiting` and neither handed a thread nor cancelled
        self._order = itertools.count()
        self._gauge = gauge

    async def run(
        self,
        call: Callable[..., T],
        *args: Any,
        edited: bool,
        stop: asyncio.Future[Any] | None = None,
    ) -> T:
        """`call(*args)` in a thread once one is free to this pass; `Stopped` instead if `stop`
        is done while it waits for one."""
        await self._slot(EDITED if edited else OTHER, stop)
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, call, *args)
        finally:
            self._release()

    def waiting(self) -> int:
        """Passes waiting for a thread."""
        return self._pending

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _slot(self, rank: int, stop: asyncio.Future[Any] | None) -> None:
        if self._free > 0 and not self._pending:
            self._free -= 1
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (rank, next(self._order), turn))
        self._count(+1)
        try:
            ends = (turn,) if stop is None else (turn, stop)
            await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            self._leave(turn)
            raise
        if stop is not None and stop.done():
            self._leave(turn)
            raise Stopped

    def _leave(self, turn: asyncio.Future[None]) -> None:
        """A waiting pass gives up (cancelled, or stopped).

        NOTE: its turn may have come meanwhile: `_release` handed it the thread (and counted it
        out) in the same loop iteration as the stop or the cancellation, before this pass woke.
        1. Still waiting: its turn is cancelled, so `_release` skips its entry; counted out here.
        2. Handed a thread: the thread goes on to the next waiting pass, or back to free.
        """
        if turn.cancel():
            self._count(-1)
        else:
            self._release()

    def _release(self) -> None:
        """Hand the thread a pass gave back to the first waiting pass, or keep it free."""
        while self._waiting:
            _, _, turn = heapq.heappop(self._waiting)
            if not turn.done():  # a cancelled waiter's turn is done (cancelled): skipped
                turn.set_result(None)
                self._count(-1)
                return
        self._free += 1

    def _count(self, change: int) -> None:
        self._pending += change
        if self._gauge is not None:
            self._gauge.set(self._pending)
