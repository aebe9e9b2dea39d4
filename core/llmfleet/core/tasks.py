"""Stopping a background asyncio task for certain.

`task.cancel()` then `await task` can hang: on Python 3.11, a cancel that lands in the same loop
iteration as the wake-up of the `wait_for` the task sits in is swallowed, `wait_for` returns its
result instead (gh-86296), and a loop that waits that way runs on. `cancel_and_wait` cancels
again until the task has ended (CI saw a gateway's shutdown hang on the one-cancel form).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

RETRY_SECONDS = 0.1
"""How long to wait for the task to end after a cancel before cancelling again."""


async def cancel_and_wait(task: asyncio.Task[Any] | None, retry: float = RETRY_SECONDS) -> None:
    """Cancel `task` until it has ended and wait for it; its CancelledError is absorbed, any
    other exception it ends with is raised here. None: nothing to stop."""
    if task is None:
        return
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=retry)
    with contextlib.suppress(asyncio.CancelledError):
        await task
