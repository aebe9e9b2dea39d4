"""The kopf registry the operator runs: its per-service daemon puts no finalizer on services
(`handlers._without_finalizer`, which reaches into kopf's registry: this is where a kopf upgrade
that moves it shows first; `tests/cluster/test_operator.py` checks the objects themselves), and
a loop that kopf stops returns by itself, before kopf would cancel it (a WARNING per loop)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, cast

import kopf
import pytest
from kopf._core.intents.stoppers import DaemonStopper

from llmfleet.crds import GROUP, PLURAL, VERSION
from llmfleet.operator.handlers import build_registry
from llmfleet.operator.metrics import OperatorMetrics
from llmfleet.operator.reconcile import Reconciler
from llmfleet.operator.watched import Watched


def _spawning(registry: kopf.OperatorRegistry) -> list[Any]:
    return list(registry._spawning._handlers)


def test_kopf_daemons_require_a_finalizer_unless_the_operator_drops_it() -> None:
    plain = kopf.OperatorRegistry()

    @kopf.daemon(GROUP, VERSION, PLURAL, registry=plain)
    async def loop(**_: Any) -> None:
        """A daemon as kopf registers it."""

    assert [h.requires_finalizer for h in _spawning(plain)] == [True]

    reconciler = cast(Reconciler, SimpleNamespace(metrics=OperatorMetrics()))
    ours = build_registry(reconciler, cast(Watched, object()), workers=1)
    handlers = _spawning(ours)
    assert handlers, "the operator registers its per-service daemon"
    assert [h.requires_finalizer for h in handlers] == [False] * len(handlers)


def test_kopf_waits_for_a_stopped_loop_before_it_cancels_it() -> None:
    reconciler = cast(Reconciler, SimpleNamespace(metrics=OperatorMetrics()))
    [handler] = _spawning(build_registry(reconciler, cast(Watched, object()), workers=1))
    assert handler.cancellation_backoff > 0
    assert handler.cancellation_timeout > 0


@pytest.mark.parametrize("fails", [False, True], ids=["idle", "backing-off"])
def test_a_stopped_loop_returns_by_itself(fails: bool, caplog: pytest.LogCaptureFixture) -> None:
    def reconcile(namespace: str, name: str) -> float | None:
        if fails:
            raise RuntimeError("the API server is unreachable")
        return None  # nothing to look at again before the resync

    metrics = OperatorMetrics()
    settings = SimpleNamespace(
        resync_seconds=600, full_resync_seconds=600, retry_seconds=600, retry_max_seconds=600
    )
    reconciler = SimpleNamespace(settings=settings, reconcile=reconcile, metrics=metrics)
    watched = SimpleNamespace(synced_at=lambda kinds: None)
    registry = build_registry(cast(Reconciler, reconciler), cast(Watched, watched), workers=1)
    service_loop = _spawning(registry)[0].fn

    def waiting() -> bool:
        """The first pass is over: the loop waits for a wake-up, or out its back-off."""
        if fails:
            return any("reconcile of ns/svc failed" in r.getMessage() for r in caplog.records)
        return metrics.has_reached("first_pass")

    async def run() -> None:
        stopper = DaemonStopper()
        loop = asyncio.create_task(service_loop(
            stopped=stopper.async_waiter, body={"metadata": {"generation": 1}},
            namespace="ns", name="svc",
        ))  # fmt: skip
        await _polled(waiting)
        stopper.set(reason=kopf.DaemonStoppingReason.OPERATOR_EXITING)
        # Past the deadline `wait_for` cancels the loop and raises: only a return passes.
        assert await asyncio.wait_for(loop, timeout=5) is None

    asyncio.run(run())


async def _polled(condition: Callable[[], bool], seconds: float = 5) -> None:
    async with asyncio.timeout(seconds):
        while not condition():
            await asyncio.sleep(0.01)
