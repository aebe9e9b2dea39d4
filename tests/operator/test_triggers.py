"""A failed pass's back-off ends early for an edit of the spec, and only for that: pod and
child events (or the same generation seen again) leave it running."""

from __future__ import annotations

import asyncio

from llmfleet.operator.handlers import Triggers


def test_only_a_new_generation_marks_the_service_edited() -> None:
    async def run() -> None:
        triggers = Triggers()
        triggers.fire("ns", "svc", generation=3)  # first sight of the service
        assert triggers.edited("ns", "svc").is_set()
        triggers.edited("ns", "svc").clear()
        triggers.fire("ns", "svc")  # a pod or child event
        triggers.fire("ns", "svc", generation=3)  # a status write: same generation
        assert triggers.get("ns", "svc").is_set()
        assert not triggers.edited("ns", "svc").is_set()
        triggers.fire("ns", "svc", generation=4)
        assert triggers.edited("ns", "svc").is_set()
        assert not triggers.edited("ns", "other").is_set()

    asyncio.run(run())


def test_the_back_off_ends_at_an_edit_not_at_other_events() -> None:
    async def run() -> None:
        triggers = Triggers()
        triggers.fire("ns", "svc", generation=1)
        triggers.edited("ns", "svc").clear()
        waiting = asyncio.create_task(triggers.back_off("ns", "svc", delay=600))
        await asyncio.sleep(0.05)
        triggers.fire("ns", "svc")  # pods changing: the back-off goes on
        triggers.fire("ns", "svc", generation=1)
        await asyncio.sleep(0.05)
        assert not waiting.done()
        triggers.fire("ns", "svc", generation=2)  # kubectl apply of a fixed spec
        await asyncio.wait_for(waiting, timeout=5)

    asyncio.run(run())


def test_the_back_off_runs_out_without_an_edit() -> None:
    async def run() -> None:
        triggers = Triggers()
        await asyncio.wait_for(triggers.back_off("ns", "svc", delay=0.05), timeout=5)

    asyncio.run(run())


def test_a_wake_sets_a_running_loop_s_event_and_keeps_nothing_for_others() -> None:
    async def run() -> None:
        triggers = Triggers()
        running = triggers.get("ns", "svc")
        triggers.wake("ns", "svc")  # a pod of a service whose loop runs
        triggers.wake("ns", "gone")  # a child of a service without a loop
        assert running.is_set()
        assert not triggers.edited("ns", "svc").is_set()
        assert ("ns", "gone") not in triggers._events

    asyncio.run(run())


def test_a_pass_takes_an_edit_once_and_the_first_pass_reads_the_status() -> None:
    async def run() -> None:
        triggers = Triggers()
        acted = {"metadata": {"generation": 3}, "status": {"observedGeneration": 3}}
        edited_while_down = {"metadata": {"generation": 4}, "status": {"observedGeneration": 3}}
        triggers.fire("ns", "old", generation=3)  # first sight sets `edited` for every service
        triggers.fire("ns", "new", generation=4)
        assert not triggers.take_edit("ns", "old", acted)
        assert triggers.take_edit("ns", "new", edited_while_down)
        assert not triggers.take_edit("ns", "new", edited_while_down)  # taken: the status lags
        triggers.fire("ns", "old")  # a pod event
        assert not triggers.take_edit("ns", "old", acted)
        triggers.fire("ns", "old", generation=5)
        assert triggers.take_edit("ns", "old", acted)
        triggers.forget("ns", "old")  # deleted; a service of the same name starts anew
        assert triggers.take_edit("ns", "old", {"metadata": {"generation": 1}})

    asyncio.run(run())
