"""One reconcile pass for one InferenceService: observe -> plan (pure) -> apply -> status.

Level-based and idempotent: every trigger runs the same pass on the full current state, so an
operator killed at any point converges when it runs again (names are fixed, writes are
server-side applies, status is written last).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from llmfleet.crds import InferenceService
from llmfleet.operator.children import Manifest
from llmfleet.operator.failures import Backoff, ChildFailure, child_key, digest
from llmfleet.operator.kube import Kube, refusal
from llmfleet.operator.metrics import OperatorMetrics
from llmfleet.operator.plan import desired
from llmfleet.operator.settings import OperatorSettings

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


class Gone(Exception):
    """The service was deleted: its reconcile loop ends."""


class Reconciler:
    def __init__(
        self,
        kube: Kube,
        settings: OperatorSettings,
        metrics: OperatorMetrics | None = None,
        clock: Clock = utc_now,
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.metrics = metrics or OperatorMetrics()
        self.clock = clock
        self.backoff = Backoff(settings.retry_seconds, settings.retry_max_seconds)
        # Passes of one service never overlap (one loop each), but different services' passes
        # run in parallel threads: the back-off table is shared.
        self._backoff_lock = threading.Lock()

    def reconcile(self, namespace: str, name: str) -> float | None:
        """One timed pass (see `_reconcile`); its duration and outcome (`ok`, `refused` when
        the API server refused a child, `gone`, `error`) become a metric."""
        started = time.perf_counter()
        outcome = "error"
        try:
            requeue, refused = self._reconcile(namespace, name)
            outcome = "refused" if refused else "ok"
            return requeue
        except Gone:
            outcome = "gone"
            with self._backoff_lock:
                self.backoff.forget((namespace, name))
            raise
        finally:
            self.metrics.reconcile_seconds.labels(namespace, name, outcome).observe(
                time.perf_counter() - started
            )

    def _reconcile(self, namespace: str, name: str) -> tuple[float | None, bool]:
        """Bring one service's children and status in line; returns when to look again, and
        whether the API server refused a child.

        Raises `Gone` when the service no longer exists or is being deleted (its children go
        with it through owner references; nothing is left to do).
        """
        body = self.kube.get_service(namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            raise Gone(f"{namespace}/{name}")
        metadata = body["metadata"]
        log = logging.LoggerAdapter(
            logging.getLogger("llmfleet.operator"), {"namespace": namespace, "service": name}
        )
        try:
            service = InferenceService.model_validate(
                {
                    "metadata": {
                        key: metadata.get(key) for key in ("name", "namespace", "uid", "generation")
                    },
                    "spec": body.get("spec", {}),
                }
            )
        except ValidationError as error:
            # Admission normally refuses such specs; this guards against an older CRD.
            message = f"spec is invalid: {error.errors()[0]['msg']}"
            self.kube.write_status(
                namespace,
                name,
                {
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "False",
                            "reason": "InvalidSpec",
                            "message": message,
                        },
                        {
                            "type": "Degraded",
                            "status": "True",
                            "reason": "InvalidSpec",
                            "message": message,
                        },
                    ]
                },
            )
            return None, False

        observed = self.kube.observe(namespace, name, body.get("status") or {})
        now = self.clock()
        plan = desired(service, observed, self.settings, now)
        failures = self._apply(namespace, name, plan.objects, log)
        if failures:
            plan = desired(service, observed, self.settings, now, failures)
        if os.environ.get("LLMFLEET_OPERATOR_FAULT") == "exit-before-status":
            # Test-only fault injection: die after the children exist, before status is written.
            log.error("fault injection: exiting before writing status")
            os._exit(137)
        for change in plan.pod_changes:
            self.kube.change_pod(namespace, change)
        pool_changes = self.metrics.pod_changes
        for event in plan.events:
            if event.reason in ("Promoted", "Demoted"):
                pool_changes.labels(namespace, name, event.reason.lower()).inc()
            log.info("%s/%s %s: %s", namespace, name, event.reason, event.message)
            try:
                self.kube.event(body, event.reason, event.message, event.warning)
            except ApiException as error:
                # Events are best-effort (a namespace being deleted refuses them, an API server
                # may throttle them): one line and a count, and the status is still written.
                log.warning("event %s not posted: %s %s", event.reason, error.status, error.reason)
                self.metrics.events_failed.labels(namespace, name, event.reason).inc()
        self.kube.write_status(namespace, name, plan.status)
        with self._backoff_lock:
            retry = self.backoff.next_try((namespace, name), self.clock().timestamp())
        waits = [wait for wait in (plan.requeue_after, retry) if wait is not None]
        return min(waits, default=None), bool(failures)

    def _apply(
        self,
        namespace: str,
        name: str,
        objects: tuple[Manifest, ...],
        log: logging.LoggerAdapter[logging.Logger],
    ) -> list[ChildFailure]:
        """Apply every child the API server has not refused lately; the refusals, fresh and
        still standing. A refusal is one warning line (no traceback: it is an answer, not a
        bug), a count, and a back-off for that child; the other children are applied."""
        service = (namespace, name)
        failures: list[ChildFailure] = []
        with self._backoff_lock:
            self.backoff.keep(service, {child_key(manifest) for manifest in objects})
        for manifest in objects:
            key, content = child_key(manifest), digest(manifest)
            with self._backoff_lock:
                standing = self.backoff.waiting(service, key, content, self.clock().timestamp())
            if standing is not None:
                failures.append(standing)
                continue
            try:
                self.kube.apply_child(name, manifest)
            except ApiException as error:
                failure = refusal(manifest, error, "apply")
                with self._backoff_lock:
                    delay = self.backoff.failed(
                        service, key, content, failure, self.clock().timestamp()
                    )
                log.warning("%s/%s: the API server refused %s; next try in %.0fs",
                            namespace, name, failure.describe(), delay)  # fmt: skip
                self.metrics.apply_refused.labels(
                    namespace, name, failure.kind, str(failure.code)
                ).inc()
                failures.append(failure)
            else:
                with self._backoff_lock:
                    self.backoff.succeeded(service, key)
        return failures
