"""kopf registrations (thin): one reconcile loop per InferenceService, woken by changes.

Each service gets an async daemon that runs a reconcile pass (in a few threads, the passes of
edited services first: `passes.py`), then sleeps until a change wakes it (to the service, seen
by kopf's watch and by the watches that feed the passes' reads, `watched.py`; to one of its
children or pods, seen by the latter), or the requeue delay passes; with neither, it looks
every resync period and runs a pass only when its full resync is due (`pacing.py`). A pass
that fails as a whole waits out an exponential back-off (or the API server's Retry-After, when
it throttled the pass: `Transient`; no pass sleeps in its thread), cut short only by an edit of
the service's spec.

When kopf stops a loop (the operator exits, or peering pauses it), the loop returns by itself:
its waits, for a wake-up, a back-off or a thread, end at the stop; a pass already in its thread
runs to its end first. kopf cancels only a loop that outlives `cancellation_backoff`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from llmfleet.crds import GROUP, PLURAL, VERSION
from llmfleet.operator.answers import Transient, api_message
from llmfleet.operator.failures import requeue_delay
from llmfleet.operator.kube import CHILD_KINDS
from llmfleet.operator.login import login
from llmfleet.operator.metrics import OperatorMetrics
from llmfleet.operator.pacing import Pacing
from llmfleet.operator.passes import Passes, Stopped, unobserved
from llmfleet.operator.reconcile import Gone, Reconciler
from llmfleet.operator.watched import Watched

log = logging.getLogger("llmfleet.operator")


class Triggers:
    """Wake-up events per (namespace, service), shared by watchers and service loops, and an
    `edited` event per service that only a new spec generation sets (so a failed pass's back-off
    ends early for an edit, not for every pod that changes).

    Everything here runs on kopf's event loop; only `Reconciler.reconcile` runs in threads.
    """

    def __init__(self) -> None:
        self._events: dict[tuple[str, str], asyncio.Event] = {}
        self._edits: dict[tuple[str, str], asyncio.Event] = {}
        self._generations: dict[tuple[str, str], int] = {}
        self._passed: set[tuple[str, str]] = set()

    def get(self, namespace: str, name: str) -> asyncio.Event:
        return self._events.setdefault((namespace, name), asyncio.Event())

    def edited(self, namespace: str, name: str) -> asyncio.Event:
        return self._edits.setdefault((namespace, name), asyncio.Event())

    def fire(self, namespace: str, name: str, generation: int | None = None) -> None:
        """Wake the service's loop; `generation` (the service's own events): a new one also
        sets `edited`."""
        self.get(namespace, name).set()
        key = (namespace, name)
        if generation is not None and self._generations.get(key) != generation:
            self._generations[key] = generation
            self.edited(namespace, name).set()

    def take_edit(self, namespace: str, name: str, body: Mapping[str, Any]) -> bool:
        """Whether the pass about to run is the first since an edit of the spec (`edited`,
        cleared now). At a loop's first pass `edited` is set for every service (first sight),
        so there the service's status says it: an edit no pass has acted on (made while no
        operator ran), or a new service."""
        key = (namespace, name)
        edits = self.edited(namespace, name)
        edited = edits.is_set() if key in self._passed else unobserved(body)
        self._passed.add(key)
        edits.clear()
        return edited

    def wake(self, namespace: str, name: str) -> None:
        """Wake the service's loop if it runs (a pod or child changed); nothing otherwise: a
        loop that starts later runs its first pass anyway."""
        event = self._events.get((namespace, name))
        if event is not None:
            event.set()

    def forget(self, namespace: str, name: str) -> None:
        for events in (self._events, self._edits, self._generations):
            events.pop((namespace, name), None)
        self._passed.discard((namespace, name))

    async def back_off(
        self, namespace: str, name: str, delay: float, stop: asyncio.Future[Any] | None = None
    ) -> None:
        """Wait out a failed pass's back-off, or less if the spec is edited meanwhile (the edit
        may be the fix) or `stop` is done. Other changes do not end it: a pass that fails (the
        API server unreachable, a permission missing) logs once per step, not once per pod
        event."""
        await _until(self.edited(namespace, name), delay, stop)


def build_registry(  # noqa: PLR0915 - the handlers, closures over the triggers and passes
    reconciler: Reconciler, watched: Watched, workers: int = 8
) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    triggers = Triggers()
    # Reconcile passes are short blocking calls; threads of our own keep them from starving
    # kopf's executor (a thread per service would stall every handler past a few services),
    # and give a pass of an edited service the first free one (`passes.py`).
    passes = Passes(workers, reconciler.metrics.passes_waiting)

    kopf.on.login(registry=registry)(login)

    @kopf.on.startup(registry=registry)
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.level = logging.WARNING
        loop = asyncio.get_running_loop()

        def wake(namespace: str, name: str) -> None:
            # The watches run in threads; a wake is handed to this loop, where the triggers
            # live (none once the loop has closed, at shutdown).
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(triggers.wake, namespace, name)

        watched.set_wake(wake)
        watched.start(list(CHILD_KINDS))

    @kopf.on.cleanup(registry=registry)
    def shutdown(**_: Any) -> None:
        watched.stop()
        passes.shutdown()

    # A stopped loop returns by itself (its waits end at `stopped`), though not at once when its
    # pass is in a thread: seconds at 1,000 services. `cancellation_backoff` is how long kopf
    # waits for that before it cancels the loop (and waits `cancellation_timeout` more); with
    # none, kopf cancels every loop right after setting `stopped`, with a WARNING for each: 1,000
    # lines when an operator of 1,000 services stops.
    @kopf.daemon(
        GROUP, VERSION, PLURAL, registry=registry, cancellation_backoff=5, cancellation_timeout=10
    )
    async def service_loop(
        *,
        stopped: kopf.DaemonStopped,
        body: kopf.Body,
        namespace: str | None,
        name: str,
        **_: Any,
    ) -> None:
        assert namespace is not None  # InferenceService is namespaced
        wake = triggers.get(namespace, name)
        loop = asyncio.get_running_loop()
        settings = reconciler.settings
        pacing = Pacing(settings.resync_seconds, settings.full_resync_seconds)
        failures = 0  # failed passes in a row
        stop = asyncio.ensure_future(stopped.wait())  # done once kopf stops the loop
        try:
            while not stopped:
                wake.clear()
                edited = triggers.take_edit(namespace, name, body)
                try:
                    requeue = await passes.run(
                        reconciler.reconcile, namespace, name, edited=edited, stop=stop
                    )
                    failures = 0
                    note_start(reconciler.metrics, watched)
                except Gone:
                    return  # deleted: owner references let the garbage collector finish
                except Stopped:
                    return  # stopped while the pass waited for a thread: it never ran
                except Exception as error:  # the pass backs off and is retried; the loop lives
                    failures += 1
                    delay = requeue_delay(
                        failures, settings.retry_seconds, settings.retry_max_seconds,
                        error.retry_after if isinstance(error, Transient) else None,
                    )  # fmt: skip
                    _log_failed_pass(namespace, name, error, failures, delay)
                    await triggers.back_off(namespace, name, delay, stop)
                    continue
                # Wait for a reason to pass again: a wake-up, the requeue, the full resync; a
                # resync period that ends with none of them runs nothing (`pacing.py`).
                pacing.ran(loop.time())
                while not stopped:
                    woken = await _woken(wake, pacing.timeout(requeue), stop)
                    if pacing.due(woken=woken, requeue=requeue, now=loop.time()):
                        break
        finally:
            stop.cancel()
            triggers.forget(namespace, name)

    _without_finalizer(registry)

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    async def service_changed(
        *, namespace: str | None, name: str, body: kopf.Body, **_: Any
    ) -> None:
        triggers.fire(namespace or "", name, body.get("metadata", {}).get("generation"))

    return registry


def note_start(metrics: OperatorMetrics, watched: Watched) -> None:
    """After a pass that went through: the start's last steps (`llmfleet_operator_start_seconds`),
    the first pass now and the watches' first LISTs when they were in memory (a pass that read
    its children waited for them)."""
    if not metrics.has_reached("listed"):
        listed = watched.synced_at(list(CHILD_KINDS))
        if listed is not None:
            metrics.reached("listed", listed)
    metrics.reached("first_pass")


async def _woken(wake: asyncio.Event, timeout: float, stop: asyncio.Future[Any]) -> bool:
    """Wait up to `timeout` seconds for `wake`, less if `stop` is done; whether it is set (by
    then, or since it was cleared before the last pass)."""
    await _until(wake, timeout, stop)
    return wake.is_set()


async def _until(event: asyncio.Event, timeout: float, stop: asyncio.Future[Any] | None) -> None:
    """Wait up to `timeout` seconds for `event`, or until `stop` is done."""
    waiting = asyncio.ensure_future(event.wait())
    try:
        ends = (waiting,) if stop is None else (waiting, stop)
        await asyncio.wait(ends, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiting.cancel()


def _log_failed_pass(
    namespace: str, name: str, error: Exception, failures: int, delay: float
) -> None:
    """One line per failed pass: the API server's answer as it said it; a traceback only for
    what is not an answer (a bug, a lost connection)."""
    if isinstance(error, Transient):
        error = error.error
    if isinstance(error, ApiException):
        log.warning("reconcile of %s/%s failed (%d in a row): the API server answered %s %s: %s; "
                    "next try in %.0fs", namespace, name, failures, error.status, error.reason,
                    api_message(error), delay)  # fmt: skip
    else:
        log.exception("reconcile of %s/%s failed (%d in a row); next try in %.0fs",
                      namespace, name, failures, delay)  # fmt: skip


def _without_finalizer(registry: kopf.OperatorRegistry) -> None:
    """Drop the finalizer kopf puts on every object with a daemon.

    Nothing needs it: children are removed by the garbage collector through owner references,
    and a finalizer would block `kubectl delete` (and namespace deletion) whenever the operator
    is down or misses the deletion. kopf offers no switch, so the registered handler is
    replaced by a copy that does not require one. kopf will not offer one: its maintainer
    declined it on purpose (nolar/kopf#896, 2026-03; #1183 closed), as kopf's promise is to
    stop a daemon before its object is gone. This loop needs no such promise: it ends on
    `Gone` or when stopped (or cancelled), and reads nothing from the object's body after it is
    deleted.

    The loops stay kopf daemons for what only daemons get: kopf stops them on a replica that
    peering pauses (a peer of higher priority came), which is what keeps two operator replicas
    from both acting. Loops of our own, started from `kopf.on.event`, would need no finalizer
    but would keep running on a paused replica: kopf has no public signal of the pause.
    """
    spawning = registry._spawning
    spawning._handlers = [
        dataclasses.replace(handler, requires_finalizer=False) for handler in spawning._handlers
    ]
