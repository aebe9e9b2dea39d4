"""The operator's own Prometheus metrics (served by `llmfleet operator` on --metrics-port)."""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from llmfleet.core.start_steps import StartSteps


class OperatorMetrics:
    """One set of metrics per operator process, on its own registry (no global state)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reconcile_seconds = Histogram(
            "llmfleet_operator_reconcile_seconds",
            "Duration of one reconcile pass of one InferenceService.",
            ["namespace", "service", "outcome"],
            buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 1.5, 2, 3, 5, 10),
            registry=self.registry,
        )
        self.passes_waiting = Gauge(
            "llmfleet_operator_passes_waiting",
            "Reconcile passes due that wait for one of the operator's pass threads (those of "
            "edited services go first): a backlog that stays up means passes come faster "
            "than the threads run them.",
            registry=self.registry,
        )
        self.start_seconds = Gauge(
            "llmfleet_operator_start_seconds",
            "Seconds from this process's start to each step of its start: serving (these "
            "metrics served: imports, the API connection, peering), listed (the last watched "
            "kind's first LIST in memory), first_pass (the first reconcile pass done). A step "
            "not reached has no sample.",
            ["step"],
            registry=self.registry,
        )
        self._start = StartSteps(self.start_seconds)
        self.pod_changes = Counter(
            "llmfleet_operator_pod_changes_total",
            "Serving-label flips: promotions of spares and demotions of serving pods.",
            ["namespace", "service", "change"],
            registry=self.registry,
        )
        self.apply_refused = Counter(
            "llmfleet_operator_apply_refused_total",
            "Child objects the API server refused to take (each try; tries back off per child).",
            ["namespace", "service", "kind", "code"],
            registry=self.registry,
        )
        self.events_failed = Counter(
            "llmfleet_operator_events_failed_total",
            "Kubernetes Events the operator could not post (best-effort: the pass goes on).",
            ["namespace", "service", "reason"],
            registry=self.registry,
        )
        self.canary_verdicts = Counter(
            "llmfleet_operator_canary_verdicts_total",
            "Canary analyses by verdict (Pass, Fail, WaitForSamples, Unavailable).",
            ["namespace", "service", "verdict"],
            registry=self.registry,
        )
        self.canary_steps = Counter(
            "llmfleet_operator_canary_steps_total",
            "Canary steps passed (the last one counts as it starts the promotion).",
            ["namespace", "service"],
            registry=self.registry,
        )
        self.canary_rollbacks = Counter(
            "llmfleet_operator_canary_rollbacks_total",
            "Canaries rolled back (reason CanaryRolledBack: a failed analysis; CanaryAborted).",
            ["namespace", "service", "reason"],
            registry=self.registry,
        )
        self.canary_weight = Gauge(
            "llmfleet_operator_canary_weight_percent",
            "Percent of the traffic the service's canary gets now (0 without one).",
            ["namespace", "service"],
            registry=self.registry,
        )
        self.slo_target = Gauge(
            "llmfleet_operator_slo_target_seconds",
            "The service's SLO (spec.slo.ttftP95Ms / itlP95Ms) in seconds, by latency (ttft, "
            "itl): what the SLO burn-rate alerts and the dashboards' target lines compare with.",
            ["namespace", "service", "latency"],
            registry=self.registry,
        )
        self.service_condition = Gauge(
            "llmfleet_operator_service_condition",
            "Each status condition of each service: 1 while True, 0 while False, with its "
            "current reason (one series per service and condition type).",
            ["namespace", "service", "type", "reason"],
            registry=self.registry,
        )
        self.pool_replicas = Gauge(
            "llmfleet_operator_pool_replicas",
            "Pods of each pool by state: serving, spare (ready, out of traffic or draining), "
            "starting (not ready yet) and pending (the scheduler cannot place them).",
            ["namespace", "service", "pool", "state"],
            registry=self.registry,
        )
        self.nonlocal_refused = Counter(
            "llmfleet_operator_nonlocal_refused_total",
            "Connections refused before connecting because the destination is outside "
            "127.0.0.0/8 and ::1 (LLMFLEET_LOOPBACK_ONLY), by client (in-flight probe).",
            ["client"],
            registry=self.registry,
        )

    def reached(self, step: str, at: float | None = None) -> None:
        """The start reached `step` (`StartSteps.reached`)."""
        self._start.reached(step, at)

    def has_reached(self, step: str) -> bool:
        return self._start.has_reached(step)


POOL_STATES = ("serving", "spare", "starting", "pending")


class ServiceSeries:
    """Keeps the per-service gauges equal to the latest pass: a condition's series follows its
    reason (the old reason's series is removed), and a deleted service's series all go."""

    def __init__(self, metrics: OperatorMetrics) -> None:
        self.metrics = metrics
        self._labels: dict[tuple[str, str], set[tuple[Gauge, tuple[str, ...]]]] = {}

    def publish(
        self,
        namespace: str,
        name: str,
        slo: dict[str, float | None],
        conditions: list[tuple[str, bool, str]],
        pools: dict[str, dict[str, int]],
    ) -> None:
        """`slo`: latency -> seconds (None: no target); `conditions`: (type, true, reason);
        `pools`: pool -> state -> pods."""
        m = self.metrics
        now: set[tuple[Gauge, tuple[str, ...]]] = set()
        values: list[tuple[Gauge, tuple[str, ...], float]] = [
            (m.slo_target, (namespace, name, latency), seconds)
            for latency, seconds in slo.items()
            if seconds is not None
        ]
        values += [
            (m.service_condition, (namespace, name, kind, reason), 1 if true else 0)
            for kind, true, reason in conditions
        ]
        values += [
            (m.pool_replicas, (namespace, name, pool, state), states.get(state, 0))
            for pool, states in pools.items()
            for state in POOL_STATES
        ]
        for gauge, labels, value in values:
            gauge.labels(*labels).set(value)
            now.add((gauge, labels))
        self._drop(self._labels.get((namespace, name), set()) - now)
        self._labels[(namespace, name)] = now

    def forget(self, namespace: str, name: str) -> None:
        self._drop(self._labels.pop((namespace, name), set()))

    @staticmethod
    def _drop(series: set[tuple[Gauge, tuple[str, ...]]]) -> None:
        for gauge, labels in series:
            with contextlib.suppress(KeyError):  # never set (or removed already)
                gauge.remove(*labels)
