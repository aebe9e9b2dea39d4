"""The autoscaler's own Prometheus metrics (served by `llmfleet autoscaler` on --metrics-port)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from llmfleet.core.start_steps import StartSteps


class AutoscalerMetrics:
    """One set per process, on its own registry (no global state)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.start_seconds = Gauge(
            "llmfleet_autoscaler_start_seconds",
            "Seconds from this process's start to each step of its start: serving (these "
            "metrics served), listed (the watches' first LISTs of services and pods in memory), "
            "first_pass (the first full pass done). A step not reached has no sample (a standby "
            "replica passes nothing).",
            ["step"],
            registry=self.registry,
        )
        self.start = StartSteps(self.start_seconds)
        self.writes_deferred = Gauge(
            "llmfleet_autoscaler_status_writes_deferred",
            "Status writes the last pass left to the passes after it: decisions that change no "
            "pool's target, past LLMFLEET_AUTOSCALER_STATUS_OTHER_WRITES_SECONDS (full passes) or "
            "any (fast passes).",
            registry=self.registry,
        )
        labels = ["namespace", "service", "pool"]
        self.desired_replicas = Gauge(
            "llmfleet_autoscaler_desired_replicas",
            "Serving replicas the autoscaler last decided for a pool.",
            labels,
            registry=self.registry,
        )
        self.desired_spares = Gauge(
            "llmfleet_autoscaler_desired_spares",
            "Warm spares the autoscaler last decided for a pool.",
            labels,
            registry=self.registry,
        )
        self.floor_replicas = Gauge(
            "llmfleet_autoscaler_floor_replicas",
            "Lowest serving count the last sizing of a pool allowed: its minReplicas, or when "
            "unset the policy's own floor (2 until the pool's load is measured light, then 1).",
            labels,
            registry=self.registry,
        )
        self.scale_events = Counter(
            "llmfleet_autoscaler_scale_events_total",
            "Changes of a pool's serving replica count, by direction (up or down).",
            [*labels, "direction"],
            registry=self.registry,
        )
        self.limited = Gauge(
            "llmfleet_autoscaler_limited",
            "1 while the GPU budget or unschedulable pods stop a service's scale-up.",
            ["namespace", "service"],
            registry=self.registry,
        )
        self.signals_missing = Counter(
            "llmfleet_autoscaler_signals_missing_total",
            "Decisions made without fresh metrics for a pool (the pool held its count).",
            [*labels, "cause"],
            registry=self.registry,
        )
        self.pass_seconds = Histogram(
            "llmfleet_autoscaler_pass_seconds",
            "Duration of one pass over every autoscaled service, by pass (full: every signal "
            "and direction; fast: the gauges between full passes, scale-ups only).",
            ["pass"],
            buckets=(0.01, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30),
            registry=self.registry,
        )
        self.nonlocal_refused = Counter(
            "llmfleet_autoscaler_nonlocal_refused_total",
            "Connections refused before connecting because the destination is outside "
            "127.0.0.0/8 and ::1 (LLMFLEET_LOOPBACK_ONLY), by client (prometheus).",
            ["client"],
            registry=self.registry,
        )
        self.errors = Counter(
            "llmfleet_autoscaler_errors_total",
            "Passes or services that failed, by stage (list, signals, write).",
            ["stage"],
            registry=self.registry,
        )
