"""The operator's own Prometheus metrics (served by `llmfleet operator` on --metrics-port)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class OperatorMetrics:
    """One set of metrics per operator process, on its own registry (no global state)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reconcile_seconds = Histogram(
            "llmfleet_operator_reconcile_seconds",
            "Duration of one reconcile pass of one InferenceService.",
            ["namespace", "service", "outcome"],
            buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10),
            registry=self.registry,
        )
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
        self.nonlocal_refused = Counter(
            "llmfleet_operator_nonlocal_refused_total",
            "Connections refused before connecting because the destination is outside "
            "127.0.0.0/8 and ::1 (LLMFLEET_LOOPBACK_ONLY), by client (in-flight probe).",
            ["client"],
            registry=self.registry,
        )
