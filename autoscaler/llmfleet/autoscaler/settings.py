"""Autoscaler settings, read from `LLMFLEET_AUTOSCALER_*` environment variables."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from llmfleet.core.loopback import LoopbackSettings


class AutoscalerSettings(LoopbackSettings):
    """`loopback_only` (env `LLMFLEET_LOOPBACK_ONLY`) guards the Prometheus client."""

    model_config = SettingsConfigDict(env_prefix="LLMFLEET_AUTOSCALER_", frozen=True)

    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
    """Prometheus to read the engines' metrics from (the Prometheus Operator's default
    Service name)."""
    namespaces: list[str] = []
    """Namespaces whose InferenceServices to size; all namespaces when empty."""
    interval_seconds: float = Field(default=15.0, gt=0)
    """Seconds between passes: one Prometheus scrape interval, as the ServiceMonitor sets it."""
    fast_interval_seconds: float = Field(default=2.0, ge=0)
    """Seconds between fast passes (0: none): the engines' running and waiting requests and KV
    usage only, on the last full pass's rates, and scale-ups only (`policy.decide_fast`): a
    queue promotes a warm spare on the tick that sees it (`promote.py`), and a surge is sized up
    to one full interval sooner. One small query per service and pass. The gauges are as fresh
    as the engines' scrape interval: spare promotion follows the first queued request within
    about one scrape interval plus one fast interval (`llmfleet sim` measures what the pass
    buys; README, "The autoscaler and the fleet simulator")."""
    rate_window: str = "1m"
    """PromQL range of the rates and latency quantiles (at least 4 scrape intervals)."""
    peak_window: str = "30s"
    """PromQL range of the short prompt-token rate whose peak within `rate_window` sizes prefill
    for bursts (at least 2 scrape intervals)."""
    scrape_interval: str = "15s"
    """The engines' scrape interval: the resolution the peak is searched at."""
    query_chunk_services: int = Field(default=100, ge=1)
    """Services per Prometheus query of a full pass: a fleet of more is read in several queries
    (`signals.chunks`: per namespace, a regex of the names), each bounded by its own timeout, so
    that one query's time grows with its services, not with the fleet, and a query that fails
    holds only its services' pools. Up to this many services: one query."""
    query_concurrency: int = Field(default=2, ge=1)
    """A full pass's queries in flight at once: Prometheus evaluates each query on one core, so
    about the cores it can spare."""
    recorded_rules: Literal["auto", "off"] = "auto"
    """What a full pass reads. `auto`: the pools' recorded series (the chart's recording rules,
    group `llmfleet.pools`) whenever Prometheus' `/api/v1/rules` shows every one the pass needs
    with this autoscaler's own windows (asked at start and every minute), else the engines' raw
    series; `off`: always the raw series. The recorded read is a few series per pool instead of
    every pod's (1,000 services x 10 pods: `bench/autoscaler_query_scale.py`), but its figures
    are as of the rules' last evaluation (up to one evaluation interval, 15 s in the chart,
    older) and a new pool is held until the next evaluation; Prometheus still pays for the
    evaluation, on its schedule rather than inside the pass. The fast pass always reads the
    raw gauges (`signals.PrometheusSignals`, `recorded.py`)."""
    latency_quantile: float = Field(default=0.95, gt=0.5, lt=1)
    """The percentile the services' TTFT and ITL targets hold for (0.99: 99% of requests within
    the target); the CRD names its fields after the default."""
    forecast_horizon_seconds: float = Field(default=60.0, ge=0)
    """How far ahead the forecast looks: about the time a new pod needs to serve (a spare
    promotes in seconds; a cold pod takes minutes to load its weights)."""
    status_refresh_seconds: float | None = Field(default=None, ge=0)
    """Rewrite an unchanged decision this often, so its reason and time stay current. Unset
    (the default): a decision is written only when it changes, so an idle fleet costs no
    writes; at 1,000 services a 60 s refresh was 17 status writes a second, each one also a
    watch event for the operator and every gateway replica."""
    status_write_concurrency: int = Field(default=4, ge=1)
    """Status writes of one pass in flight at once. A pass writes every service whose decision
    changed: at the first pass after an install, or when Prometheus goes away and every service
    says so, that is the whole fleet, and the pass (and the fast passes behind it) waits for all
    of them: 102 s at 1,000 services in bench/control_plane_scale.py. Four at once overlap the
    round trips; on the 2-core benchmark machine the API server's own CPU per PATCH bounds them
    (49 vs 60 writes/s: bench/status_write_concurrency.py), which is why most such writes are
    also spread over passes (`status_other_writes_seconds`). The Kubernetes client keeps 5
    connections per CPU it sees; the two watches hold two."""
    status_other_writes_seconds: float | None = Field(default=1.0, ge=0)
    """How long after a full pass's status writes start it may still start one that changes no
    pool's serving count or spares (a service's first decision that keeps its spec's counts, a
    reason, a floor's memory, signals going missing or coming back); the rest are written by
    the passes after it, at least one each. Writes that change a count all go first, and fast
    passes write only those. Bounds a pass when much of the fleet has such a write at once:
    1,000 of them held the first pass after an install for 102 s (`loop.py`). Unset: no
    bound."""
    profiles_dir: Path | None = None
    """Directory of capacity profiles (`llmfleet-runtime profile` output), one per model."""
    field_manager: str = "llmfleet-autoscaler"
    leader_election: bool = False
    """Run passes only while holding the Lease `lease_namespace/lease_name`
    (coordination.k8s.io): replicas sharing it elect one active autoscaler, the others stand
    by and take over once it stops renewing (`lease_seconds`). Off: every process acts (one
    replica only)."""
    lease_name: str = "llmfleet-autoscaler"
    """The Lease's name."""
    lease_namespace: str = "default"
    """The Lease's namespace (the chart: its release namespace)."""
    lease_seconds: float = Field(default=60.0, gt=0)
    """How long a Lease lasts after its holder's last renewal (each pass renews it): the
    longest a standby waits before it takes over from a holder that stopped."""
    metrics_port: int = Field(default=8082, ge=0, le=65535)
    """Port of the autoscaler's /metrics endpoint (0: no endpoint); the gateway has 8080 and the
    operator 8081, so all three run side by side on one machine."""
    metrics_host: str = "127.0.0.1"
    """Address the metrics endpoint binds to: loopback, for a local run; in a pod, `0.0.0.0`
    so that Prometheus can scrape it."""
