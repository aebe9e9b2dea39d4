"""kopf registrations (thin): one reconcile loop per InferenceService, woken by changes.

Each service gets a daemon thread that reconciles, then sleeps until a change to the service or
one of its children or pods wakes it (or the requeue delay / resync period passes).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

import kopf

from llmfleet.crds import GROUP, PLURAL, VERSION
from llmfleet.crds import labels as L
from llmfleet.operator.reconcile import Reconciler

log = logging.getLogger("llmfleet.operator")
CHILD_KINDS = (
    ("", "v1", "pods"),
    ("apps", "v1", "deployments"),
    ("", "v1", "services"),
    ("", "v1", "configmaps"),
    ("policy", "v1", "poddisruptionbudgets"),
)


class Triggers:
    """Wake-up events per (namespace, service), shared by watchers and service loops."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: dict[tuple[str, str], threading.Event] = {}

    def get(self, namespace: str, name: str) -> threading.Event:
        with self._lock:
            return self._events.setdefault((namespace, name), threading.Event())

    def fire(self, namespace: str, name: str) -> None:
        self.get(namespace, name).set()

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._events.pop((namespace, name), None)


def build_registry(reconciler: Reconciler, resync_seconds: float) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    triggers = Triggers()

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return kopf.login_via_client(**kwargs)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.level = logging.WARNING

    @kopf.daemon(GROUP, VERSION, PLURAL, registry=registry, cancellation_timeout=10)
    def service_loop(
        *,
        stopped: kopf.DaemonStopped,
        body: kopf.Body,
        namespace: str | None,
        name: str,
        **_: Any,
    ) -> None:
        assert namespace is not None  # InferenceService is namespaced
        wake = triggers.get(namespace, name)
        while not stopped:
            wake.clear()
            try:
                requeue = reconciler.reconcile(body)
            except Exception:  # a failed pass is logged and retried soon; the loop must live
                log.exception("reconcile of %s/%s failed; retrying", namespace, name)
                requeue = 2.0
            deadline = time.monotonic() + (requeue or resync_seconds)
            while not stopped and not wake.is_set() and time.monotonic() < deadline:
                wake.wait(0.25)
        triggers.forget(namespace, name)

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    def service_changed(*, namespace: str | None, name: str, **_: Any) -> None:
        triggers.fire(namespace or "", name)

    for group, version, plural in CHILD_KINDS:

        @kopf.on.event(
            group,
            version,
            plural,
            registry=registry,
            id=f"child-{plural}",
            labels={L.SERVICE: kopf.PRESENT, L.MANAGED_BY: L.MANAGED_BY_VALUE}
            if plural != "pods"
            else {L.SERVICE: kopf.PRESENT},
        )
        def child_changed(*, namespace: str | None, labels: Mapping[str, str], **_: Any) -> None:
            triggers.fire(namespace or "", labels[L.SERVICE])

    return registry
