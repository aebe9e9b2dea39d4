"""Reconcile passes wait for a free thread, the passes of edited services first: a spec edited
while the operator was down is acted on before the thousand passes of its start that find
nothing to do (`operator/passes.py`). A pass whose loop stops while it waits gives up, and the
thread it would have had goes on."""

from __future__ import annotations

import asyncio
import threading

import pytest

from llmfleet.operator.passes import OTHER, Passes, Stopped, unobserved


def test_an_edited_service_s_pass_takes_the_next_free_thread() -> None:
    async def run() -> list[str]:
        passes = Passes(workers=1)
        release = threading.Event()
        ran: list[str] = []

        def work(name: str) -> str:
            ran.append(name)
            if name == "busy":
                release.wait(10)
            return name

        try:
            busy = asyncio.create_task(passes.run(work, "busy", edited=False))
            while not ran:  # the one thread is taken
                await asyncio.sleep(0.01)
            waiting = [asyncio.create_task(passes.run(work, name, edited=name.startswith("e")))
                       for name in ("a", "b", "e1", "c", "e2")]  # fmt: skip
            while passes.waiting() < 5:
                await asyncio.sleep(0.01)
            release.set()
            assert await asyncio.wait_for(asyncio.gather(busy, *waiting), timeout=10) == [
                "busy", "a", "b", "e1", "c", "e2"]  # fmt: skip
        finally:
            passes.shutdown()
        return ran

    assert asyncio.run(run()) == ["busy", "e1", "e2", "a", "b", "c"]


def test_a_cancelled_waiter_gives_its_turn_on() -> None:
    async def run() -> None:
        passes = Passes(workers=1)
        release = threading.Event()
        try:
            busy = asyncio.create_task(passes.run(release.wait, 10, edited=False))
            await asyncio.sleep(0.05)
            gone = asyncio.create_task(passes.run(lambda: "gone", edited=True))
            later = asyncio.create_task(passes.run(lambda: "later", edited=False))
            while passes.waiting() < 2:
                await asyncio.sleep(0.01)
            gone.cancel()
            release.set()
            assert await asyncio.wait_for(later, timeout=10) == "later"
            assert await busy is True
            # The thread is free again: a pass now runs at once, and none waits.
            assert await asyncio.wait_for(passes.run(lambda: 1, edited=False), timeout=10) == 1
            assert passes.waiting() == 0
        finally:
            passes.shutdown()

    asyncio.run(run())


def test_a_pass_cancelled_after_its_turn_came_frees_the_thread() -> None:
    async def run() -> None:
        passes = Passes(workers=1)
        release = threading.Event()
        try:
            busy = asyncio.create_task(passes.run(release.wait, 10, edited=False))
            await asyncio.sleep(0.05)
            handed = asyncio.create_task(passes.run(lambda: "x", edited=False))
            while passes.waiting() < 1:
                await asyncio.sleep(0.01)
            release.set()
            await busy  # its turn is handed to `handed`, cancelled before or in its call
            handed.cancel()
            await asyncio.gather(handed, return_exceptions=True)
            assert await asyncio.wait_for(passes.run(lambda: 2, edited=False), timeout=10) == 2
        finally:
            passes.shutdown()

    asyncio.run(run())


@pytest.mark.parametrize("others", [0, 1], ids=["thread-back-to-free", "thread-to-the-next"])
def test_a_waiting_pass_gives_up_when_its_loop_stops(others: int) -> None:
    async def run() -> None:
        passes = Passes(workers=1)
        release = threading.Event()
        try:
            busy = asyncio.create_task(passes.run(release.wait, 10, edited=False))
            while passes._free:  # the one thread is taken
                await asyncio.sleep(0.01)
            stop = asyncio.get_running_loop().create_future()
            stopping = asyncio.create_task(passes.run(lambda: "ran", edited=True, stop=stop))
            later = [asyncio.create_task(passes.run(lambda: "later", edited=False))
                     for _ in range(others)]  # fmt: skip
            while passes.waiting() < 1 + others:
                await asyncio.sleep(0.01)
            stop.set_result(None)
            with pytest.raises(Stopped):
                await asyncio.wait_for(stopping, timeout=5)
            assert (passes.waiting(), passes._free) == (others, 0)  # the thread is still busy
            release.set()
            assert await asyncio.wait_for(asyncio.gather(busy, *later), timeout=10) == [
                True, *["later"] * others]  # fmt: skip
            assert (passes.waiting(), passes._free) == (0, 1)
        finally:
            passes.shutdown()

    asyncio.run(run())


def test_a_turn_handed_as_the_loop_stops_goes_on_to_the_next() -> None:
    async def run() -> None:
        passes = Passes(workers=1)
        try:
            await passes._slot(OTHER, None)  # the one thread, taken
            stop = asyncio.get_running_loop().create_future()
            stopping = asyncio.create_task(passes.run(lambda: "ran", edited=True, stop=stop))
            later = asyncio.create_task(passes.run(lambda: "later", edited=False))
            while passes.waiting() < 2:
                await asyncio.sleep(0.01)
            # NOTE: the thread is handed to `stopping` and its loop stops in the same step,
            # before `stopping` wakes: it gives up, and the thread goes on to `later`.
            passes._release()
            stop.set_result(None)
            with pytest.raises(Stopped):
                await asyncio.wait_for(stopping, timeout=5)
            assert await asyncio.wait_for(later, timeout=10) == "later"
            assert (passes.waiting(), passes._free) == (0, 1)
        finally:
            passes.shutdown()

    asyncio.run(run())


def test_unobserved_reads_the_status_against_the_generation() -> None:
    assert unobserved({"metadata": {"generation": 3}, "status": {"observedGeneration": 2}})
    assert unobserved({"metadata": {"generation": 1}})  # never reconciled
    assert not unobserved({"metadata": {"generation": 3}, "status": {"observedGeneration": 3}})
    assert not unobserved({"metadata": {}})


def test_the_gauge_counts_the_waiting_passes() -> None:
    from prometheus_client import CollectorRegistry, Gauge  # noqa: PLC0415

    async def run() -> list[float]:
        gauge = Gauge("waiting", "passes waiting", registry=CollectorRegistry())
        passes = Passes(workers=1, gauge=gauge)
        release = threading.Event()
        seen = []
        try:
            busy = asyncio.create_task(passes.run(release.wait, 10, edited=False))
            await asyncio.sleep(0.05)
            queued = [asyncio.create_task(passes.run(int, edited=False)) for _ in range(3)]
            await asyncio.sleep(0.05)
            seen.append(gauge._value.get())
            queued[0].cancel()
            await asyncio.gather(queued[0], return_exceptions=True)
            seen.append(gauge._value.get())
            release.set()
            await asyncio.wait_for(asyncio.gather(busy, *queued[1:]), timeout=10)
            seen.append(gauge._value.get())
        finally:
            passes.shutdown()
        return seen

    assert asyncio.run(run()) == [3, 2, 0]
