"""One reconcile pass for one InferenceService: observe -> plan (pure) -> apply -> status.

Level-based and idempotent: every trigger runs the same pass on the full current state, so an
operator killed at any point converges when it runs again (names are fixed, writes are
server-side applies, status is written last).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from functools import partial
from typing import Any, Protocol

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from llmfleet.core.loopback import LoopbackGuard
from llmfleet.crds import InferenceService, InferenceServiceSpec
from llmfleet.operator.analyst import PrometheusAnalyst
from llmfleet.operator.answers import Transient, refusal
from llmfleet.operator.drift import drifted, kept_immutable, patch_change
from llmfleet.operator.failures import Backoff, ChildFailure, ChildKey, child_key, digest
from llmfleet.operator.kube import Kube
from llmfleet.operator.metrics import OperatorMetrics, ServiceSeries
from llmfleet.operator.observed import Observed
from llmfleet.operator.plan import Plan, desired
from llmfleet.operator.rollout import Analysis, Verdict, active, analysis_due
from llmfleet.operator.settings import OperatorSettings

Clock = Callable[[], datetime]
BeforeStatus = Callable[[str, str], None]
"""Called with (namespace, name) once a pass has applied and deleted its children, before it
changes pods, posts Events or writes status: a test seam (`tests/cluster/crashing_operator.py`
kills the process there, to show a restart converges). Production passes none."""
log = logging.getLogger("llmfleet.operator")


def utc_now() -> datetime:
    return datetime.now(UTC)


class Analyst(Protocol):
    """Compares a canary with the stable revision (`analyst.PrometheusAnalyst`)."""

    def analyse(
        self, spec: InferenceServiceSpec, namespace: str, service: str, canary: str
    ) -> Analysis: ...


class NoPrometheus:
    """The analyst when no Prometheus URL is set: every analysis is unavailable, so a canary
    holds at its step and says why."""

    def analyse(
        self, spec: InferenceServiceSpec, namespace: str, service: str, canary: str
    ) -> Analysis:
        return Analysis(Verdict.UNAVAILABLE, "no Prometheus to ask: set "
                        "LLMFLEET_OPERATOR_PROMETHEUS_URL (or promote by annotation)")  # fmt: skip


def analyst_from(settings: OperatorSettings, metrics: OperatorMetrics) -> Analyst:
    if not settings.prometheus_url:
        return NoPrometheus()
    guard = LoopbackGuard(
        settings.loopback_only, lambda client: metrics.nonlocal_refused.labels(client).inc(), log
    )
    return PrometheusAnalyst(
        settings.prometheus_url, timeout_s=settings.analysis_timeout_seconds, guard=guard
    )


class Gone(Exception):
    """The service was deleted: its reconcile loop ends."""


class Reconciler:
    def __init__(
        self,
        kube: Kube,
        settings: OperatorSettings,
        metrics: OperatorMetrics | None = None,
        clock: Clock = utc_now,
        analyst: Analyst | None = None,
        *,
        before_status: BeforeStatus | None = None,
    ) -> None:
        self.kube = kube
        self.before_status = before_status
        self.settings = settings
        self.metrics = metrics or OperatorMetrics()
        self.series = ServiceSeries(self.metrics)
        self.clock = clock
        self.analyst = analyst or analyst_from(settings, self.metrics)
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
            self.series.forget(namespace, name)
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
        try:
            service = InferenceService.model_validate(
                {
                    "metadata": {
                        key: metadata.get(key)
                        for key in ("name", "namespace", "uid", "generation", "annotations")
                    },
                    "spec": body.get("spec", {}),
                }
            )
        except ValidationError as error:
            # Admission normally refuses such specs; this guards against an older CRD.
            message = f"spec is invalid: {error.errors()[0]['msg']}"
            said = {"Ready": "False", "Degraded": "True", "Stalled": "True", "Reconciling": "False"}
            self._write_status(
                namespace,
                name,
                body,
                {
                    # This generation was looked at: GitOps tools then report the failure
                    # instead of waiting for the operator to catch up.
                    "observedGeneration": metadata.get("generation"),
                    "conditions": [
                        {
                            "type": kind,
                            "status": status,
                            "reason": "InvalidSpec",
                            "message": message,
                        }
                        for kind, status in said.items()
                    ],
                },
            )
            return None, False

        pools = service.spec.pools()
        observed = self.kube.observe(
            namespace, name, body.get("status") or {}, pools, service.spec.served_name
        )
        now = self.clock()
        observed = self._with_analysis(service, observed, now)
        plan = desired(service, observed, self.settings, now)
        failures = self._apply(namespace, name, metadata.get("uid"), plan, observed)
        if failures:
            plan = desired(service, observed, self.settings, now, failures)
        refused_deletes = self._delete(namespace, name, plan)
        if refused_deletes:
            failures += refused_deletes
            plan = desired(service, observed, self.settings, now, failures)
        if self.before_status is not None:
            self.before_status(namespace, name)
        for change in plan.pod_changes:
            self.kube.change_pod(namespace, change)
        pool_changes = self.metrics.pod_changes
        for event in plan.events:
            if event.reason in ("Promoted", "Demoted"):
                pool_changes.labels(namespace, name, event.reason.lower()).inc()
            log.info("%s/%s %s: %s", namespace, name, event.reason, event.message)
            try:
                self.kube.event(body, event.reason, event.message, event.warning)
            except (ApiException, Transient) as refused:
                answer = refused.error if isinstance(refused, Transient) else refused
                # Events are best-effort (a namespace being deleted refuses them, an API server
                # may throttle them): one line and a count, and the status is still written.
                log.warning("%s/%s: event %s not posted: %s %s",
                            namespace, name, event.reason, answer.status,
                            answer.reason)  # fmt: skip
                self.metrics.events_failed.labels(namespace, name, event.reason).inc()
        self._write_status(namespace, name, body, plan.status)
        self._publish(namespace, name, service, plan, observed)
        self._rollout_said(namespace, name, plan, observed)
        with self._backoff_lock:
            retry = self.backoff.next_try((namespace, name), self.clock().timestamp())
        waits = [wait for wait in (plan.requeue_after, retry) if wait is not None]
        return min(waits, default=None), bool(failures)

    def _write_status(
        self, namespace: str, name: str, body: Mapping[str, Any], status: Mapping[str, Any]
    ) -> None:
        """Merge-patch the status when that changes what `body` (the service as this pass
        read it) holds: an idle pass writes nothing."""
        change = patch_change(body.get("status") or {}, status)
        if change is not None:
            log.debug("%s/%s: writing status: %s changes", namespace, name, change)
            self.kube.write_status(namespace, name, status)

    def _publish(
        self, namespace: str, name: str, service: InferenceService, plan: Plan, observed: Observed
    ) -> None:
        """The pass's SLO targets, conditions and pool counts as gauges (for the chart's alerts
        and dashboards, which cannot read status)."""
        slo = service.spec.slo
        conditions = plan.status.get("conditions")
        pools = plan.status.get("pools")
        counts: dict[str, dict[str, int]] = {}
        for pool, figures in (pools if isinstance(pools, dict) else {}).items():
            if not figures:  # a pool the merge patch removes from status
                continue
            pending = sum(1 for pod in observed.pool_pods(pool) if pod.unschedulable)
            ready = figures.get("readyReplicas", 0)
            counts[pool] = {
                "serving": figures.get("servingReplicas", 0),
                "spare": figures.get("spareReplicas", 0),
                "pending": pending,
                "starting": max(0, figures.get("replicas", 0) - ready - pending),
            }
        self.series.publish(
            namespace,
            name,
            {
                "ttft": slo.ttft_p95_ms / 1000 if slo.ttft_p95_ms is not None else None,
                "itl": slo.itl_p95_ms / 1000 if slo.itl_p95_ms is not None else None,
            },
            [
                (c["type"], c["status"] == "True", c.get("reason", ""))
                for c in (conditions if isinstance(conditions, list) else [])
            ],
            counts,
        )

    def _with_analysis(
        self, service: InferenceService, observed: Observed, now: datetime
    ) -> Observed:
        """`observed` with a canary analysis when one is due (the one read of Prometheus)."""
        canary = observed.canary
        if canary is None or not analysis_due(canary, service.spec.rollout, now):
            return observed
        meta = service.metadata
        analysis = self.analyst.analyse(service.spec, meta["namespace"], meta["name"],
                                        canary.revision)  # fmt: skip
        return dataclasses.replace(observed, analysis=analysis)

    def _rollout_said(self, namespace: str, name: str, plan: Plan, observed: Observed) -> None:
        """One log line per verdict with its figures, and the rollout's metrics."""
        rollout = plan.rollout
        if rollout is None:
            return
        decision = rollout.decision
        canary = decision.canary
        analysis = observed.analysis
        if analysis is not None and observed.canary is not None:
            before = observed.canary
            log.info("%s/%s canary %s step %d (weight %d%%): %s: %s", namespace, name,
                     before.revision, before.step + 1, before.weight, analysis.verdict.value,
                     analysis.failed or analysis.summary)  # fmt: skip
            self.metrics.canary_verdicts.labels(namespace, name, analysis.verdict.value).inc()
        if decision.steps_advanced:
            self.metrics.canary_steps.labels(namespace, name).inc(decision.steps_advanced)
        if decision.rolled_back:
            reason = decision.events[-1].reason if decision.events else "CanaryRolledBack"
            self.metrics.canary_rollbacks.labels(namespace, name, reason).inc()
        weight = canary.weight if canary is not None and active(canary) else 0
        self.metrics.canary_weight.labels(namespace, name).set(weight)

    def _apply(
        self, namespace: str, name: str, uid: str | None, plan: Plan, observed: Observed
    ) -> list[ChildFailure]:
        """Apply every child that differs from the object observed (`drift.drifted`) and that
        the API server has not refused lately; the refusals, fresh and still standing. The
        other children are applied whatever happens to one.

        Before the first child it would create, the pass asks the API server whether the
        service `uid` still stands (`Kube.still_stored`) and raises `Gone` if not: the watch
        may not have brought the service's deletion yet when the collector's deletion of its
        children has come."""
        service = (namespace, name)
        confirmed = False
        with self._backoff_lock:
            keys = {child_key(manifest) for manifest in plan.objects}
            self.backoff.keep(service, keys | {c.key for c in plan.deletions})
        stored = {child.key: child.body for child in observed.children}
        failures: list[ChildFailure] = []
        for planned in plan.objects:
            key = child_key(planned)
            manifest = kept_immutable(planned, stored.get(key))
            why = drifted(manifest, stored.get(key))
            if why is None:
                with self._backoff_lock:
                    self.backoff.succeeded(service, key)  # as stored: nothing stands
                continue
            if key not in stored and not confirmed:
                if uid is None or not self.kube.still_stored(namespace, name, uid):
                    raise Gone(f"{namespace}/{name}")
                confirmed = True
            log.debug("%s/%s: applying %s %s: %s", namespace, name, manifest["kind"],
                      manifest["metadata"]["name"], why)  # fmt: skip
            failure = self._write(
                service, key, digest(manifest),
                write=partial(self.kube.apply_child, name, manifest),
                refused=partial(refusal, manifest, action="apply"),
            )  # fmt: skip
            if failure is not None:
                failures.append(failure)
        return failures

    def _delete(self, namespace: str, name: str, plan: Plan) -> list[ChildFailure]:
        """Delete the children the spec no longer wants; the refusals (as `_apply`)."""
        failures: list[ChildFailure] = []
        for child in plan.deletions:
            failure = self._write(
                (namespace, name), child.key, child.uid,
                write=partial(self.kube.delete_child, child),
                refused=partial(refusal, {"kind": child.kind, "metadata": {"name": child.name}},
                                action="delete"),
            )  # fmt: skip
            if failure is None:
                log.info("%s/%s: deleted %s %s (no longer in the spec)",
                         namespace, name, child.kind, child.name)  # fmt: skip
            else:
                failures.append(failure)
        return failures

    def _write(
        self,
        service: tuple[str, str],
        key: ChildKey,
        content: str,
        *,
        write: Callable[[], None],
        refused: Callable[[ApiException], ChildFailure],
    ) -> ChildFailure | None:
        """One write of one child unless its back-off for this very `content` still runs; the
        failure that stands, or None. A refusal is one warning line (no traceback: it is an
        answer, not a bug), a count, and the child's next back-off step."""
        with self._backoff_lock:
            standing = self.backoff.waiting(service, key, content, self.clock().timestamp())
        if standing is not None:
            return standing
        try:
            write()
        except ApiException as error:
            failure = refused(error)
            with self._backoff_lock:
                now = self.clock().timestamp()
                delay = self.backoff.failed(service, key, content, failure, now)
            log.warning("%s/%s: the API server refused %s; next try in %.0fs",
                        *service, failure.describe(), delay)  # fmt: skip
            self.metrics.apply_refused.labels(*service, failure.kind, str(failure.code)).inc()
            return failure
        with self._backoff_lock:
            self.backoff.succeeded(service, key)
        return None
