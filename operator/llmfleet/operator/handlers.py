"""kopf registrations (thin): one reconcile loop per InferenceService, woken by changes.

Each service gets an asyncio task (`ServiceLoops`, started by kopf's watch of the services)
that runs a reconcile pass (in a small thread pool), then sleeps until a change wakes it (to the
service, seen by kopf's watch and by the watches that feed the passes' reads, `watched.py`; to
one of its children or pods, seen by the latter), or the requeue delay / resync period passes.
A pass that fails as a whole waits out an exponential back-off (or the API server's Retry-After,
when it throttled the pass: `Transient`; no pass sleeps in its thread), cut short only by an
edit of the service's spec.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from llmfleet.crds import GROUP, PLURAL, VERSION
from llmfleet.operator.failures import requeue_delay
from llmfleet.operator.kube import CHILD_KINDS, Transient, api_message
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

    def wake(self, namespace: str, name: str) -> None:
        """Wake the service's loop if it runs (a pod or child changed); nothing otherwise: a
        loop that starts later runs its first pass anyway."""
        event = self._events.get((namespace, name))
        if event is not None:
            event.set()

    def forget(self, namespace: str, name: str) -> None:
        for events in (self._events, self._edits, self._generations):
            events.pop((namespace, name), None)

    async def back_off(self, namespace: str, name: str, delay: float) -> None:
        """Wait out a failed pass's back-off, or less if the spec is edited meanwhile (the edit
        may be the fix). Other changes do not end it: a pass that fails (the API server
        unreachable, a permission missing) logs once per step, not once per pod event."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.edited(namespace, name).wait(), timeout=delay)


class ServiceLoops:
    """One reconcile loop per InferenceService, an asyncio task on kopf's event loop: started
    by the service's first event, woken by its triggers, ended when a pass finds the service
    gone (or at shutdown). kopf's daemons would run the same loops, but kopf puts a finalizer on
    every object with a daemon (it has no switch), and a finalizer blocks `kubectl delete` and
    namespace deletion whenever the operator is down; children need none (owner references let
    the garbage collector remove them)."""

    def __init__(
        self,
        reconciler: Reconciler,
        resync_seconds: float,
        triggers: Triggers,
        executor: ThreadPoolExecutor,
    ) -> None:
        self._reconciler, self._resync = reconciler, resync_seconds
        self._triggers, self._executor = triggers, executor
        self._tasks: dict[tuple[str, str], asyncio.Task[None]] = {}

    def changed(self, kind: str | None, namespace: str, name: str, generation: int | None) -> None:
        """A watch event of the service (`kind` None: kopf's initial listing): wake its loop,
        or start one."""
        self._triggers.fire(namespace, name, generation)
        if (namespace, name) not in self._tasks and kind != "DELETED":
            self._tasks[(namespace, name)] = asyncio.create_task(
                self._run(namespace, name), name=f"reconcile {namespace}/{name}"
            )

    async def stop(self, timeout: float = 10) -> None:
        """Cancel every loop (a pass in its thread finishes there; its loop ends at once)."""
        running = list(self._tasks.values())
        for task in running:
            task.cancel()
        if running:
            await asyncio.wait(running, timeout=timeout)

    async def _run(self, namespace: str, name: str) -> None:
        triggers, settings = self._triggers, self._reconciler.settings
        wake = triggers.get(namespace, name)
        loop = asyncio.get_running_loop()
        failures = 0  # failed passes in a row
        try:
            while True:
                wake.clear()
                triggers.edited(namespace, name).clear()
                try:
                    requeue = await loop.run_in_executor(
                        self._executor, self._reconciler.reconcile, namespace, name
                    )
                    failures = 0
                except Gone:
                    # Deleted: owner references let the garbage collector finish. An event
                    # during the pass may be a new service of the same name: look again.
                    if not wake.is_set():
                        return
                    continue
                except Exception as error:  # the pass backs off and is retried; the loop lives
                    failures += 1
                    delay = requeue_delay(
                        failures, settings.retry_seconds, settings.retry_max_seconds,
                        error.retry_after if isinstance(error, Transient) else None,
                    )  # fmt: skip
                    _log_failed_pass(namespace, name, error, failures, delay)
                    await triggers.back_off(namespace, name, delay)
                    continue
                # A periodic resync runs the same pass, which compares every child with the
                # object as stored (in case a watch missed a change) and writes only drift.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), timeout=requeue or self._resync)
        finally:
            triggers.forget(namespace, name)
            self._tasks.pop((namespace, name), None)


def build_registry(
    reconciler: Reconciler, resync_seconds: float, watched: Watched, workers: int = 8
) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    triggers = Triggers()
    # Reconcile passes are short blocking calls; a pool of our own keeps them from starving
    # kopf's executor (a thread per service would stall every handler past a few services).
    executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="reconcile")
    loops = ServiceLoops(reconciler, resync_seconds, triggers, executor)

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return kopf.login_via_client(**kwargs)

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
    async def shutdown(**_: Any) -> None:
        await loops.stop()
        watched.stop()
        executor.shutdown(wait=False, cancel_futures=True)

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    async def service_changed(
        *, type: str | None, namespace: str | None, name: str, body: kopf.Body, **_: Any
    ) -> None:
        assert namespace is not None  # InferenceService is namespaced
        loops.changed(type, namespace, name, body.get("metadata", {}).get("generation"))

    return registry


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
