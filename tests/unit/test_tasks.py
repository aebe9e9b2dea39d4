"""core/tasks.py: a background task is stopped even when it swallows a cancel."""

from __future__ import annotations

import asyncio

import pytest

from llmfleet.core.tasks import cancel_and_wait


async def _loses_cancels(lose: int, ended: list[str]) -> None:
    """Runs on through its first `lose` cancels (as Python 3.11's `wait_for` can, gh-86296)."""
    lost = 0
    try:
        while True:
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                if lost == lose:
                    raise
                lost += 1
    finally:
        ended.append("ended")


@pytest.mark.parametrize("lose", [0, 1, 3])
def test_a_task_that_loses_cancels_is_stopped(lose: int) -> None:
    ended: list[str] = []

    async def scenario() -> None:
        task = asyncio.create_task(_loses_cancels(lose, ended))
        await asyncio.sleep(0.02)
        stopping = asyncio.create_task(cancel_and_wait(task, retry=0.02))
        await asyncio.wait({stopping}, timeout=5)  # no cancel on timeout: a hang stays one
        done = stopping.done()
        task.cancel()
        stopping.cancel()
        await asyncio.gather(task, stopping, return_exceptions=True)
        assert done, "cancel_and_wait still waits on a task that lost a cancel"
        assert task.cancelled()

    asyncio.run(scenario())
    assert ended == ["ended"]


def test_one_cancel_and_one_await_hang_on_such_a_task() -> None:
    """What cancel_and_wait is for: the plain form does not end."""
    ended: list[str] = []

    async def scenario() -> bool:
        task = asyncio.create_task(_loses_cancels(1, ended))
        await asyncio.sleep(0.02)
        task.cancel()
        waiting = asyncio.ensure_future(asyncio.wait({task}, timeout=0.3))
        await waiting
        hung = not task.done()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return hung

    assert asyncio.run(scenario())


def test_another_error_it_ends_with_is_raised_and_none_is_nothing() -> None:
    async def fails_on_cancel() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            raise RuntimeError("cleanup failed") from None

    async def scenario() -> None:
        await cancel_and_wait(None)
        task = asyncio.create_task(fails_on_cancel())
        await asyncio.sleep(0.01)
        with pytest.raises(RuntimeError, match="cleanup failed"):
            await cancel_and_wait(task)

    asyncio.run(scenario())
