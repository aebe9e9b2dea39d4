"""Operator settings, read from `LLMFLEET_OPERATOR_*` environment variables."""

from __future__ import annotations

from importlib.metadata import version

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from llmfleet.core.loopback import LoopbackSettings

RUNTIME_REPOSITORY = "ghcr.io/llmfleet/llmfleet-runtime"
"""Where the runtime image is pushed (runtime_image/Dockerfile, `llmfleet images build runtime`)."""


class OperatorSettings(LoopbackSettings):
    """`loopback_only` (env `LLMFLEET_LOOPBACK_ONLY`) guards the in-flight probe."""

    model_config = SettingsConfigDict(env_prefix="LLMFLEET_OPERATOR_", frozen=True)

    namespaces: list[str] = []
    """Namespaces to watch; all namespaces when empty."""
    field_manager: str = "llmfleet-operator"
    """The one server-side-apply field manager every write of the operator uses."""
    runtime_image: str = f"{RUNTIME_REPOSITORY}:{version('llmfleet')}"
    """Engine image when a service's `runtime.image` is unset (DESIGN.md §6): the runtime image
    of this llmfleet's version."""
    engine_image_pull_secrets: list[str] = []
    """Secrets (in each service's namespace) to pull engine images with, for services whose
    `runtime.imagePullSecrets` is unset (JSON list in the environment)."""
    engine_user_id: int = Field(default=10001, ge=1, le=2**31 - 1)
    """uid and gid the engine pods run as (`runAsUser`, `runAsGroup`, `fsGroup`); the runtime
    image's user. Never 0: the pods pass Pod Security `restricted`."""
    drain_seconds: int = Field(default=120, ge=0)
    """How long a demoted pod keeps its in-flight requests before it may be deleted; also the
    pods' termination grace period (plus a margin)."""
    retry_seconds: float = Field(default=2.0, gt=0)
    """After the API server refuses a child (or a whole pass fails), wait this long before
    trying again; the wait doubles with each failure in a row, up to `retry_max_seconds`. An
    edited spec is tried at once."""
    retry_max_seconds: float = Field(default=300.0, gt=0)
    """The longest wait between two tries of a refused child or a failing pass."""
    resync_seconds: float = Field(default=30.0, gt=0)
    """How often a service's loop that nothing woke looks whether its full resync is due; a
    look that finds none runs no pass (a change, or a time-based state's own requeue, runs one
    at once)."""
    full_resync_seconds: float = Field(default=300.0, gt=0)
    """Reconcile every service at least this often (at the next look, `resync_seconds`), even
    when nothing changed: the safety net for what no watch wakes it for (the ServiceMonitor CRD
    installed, a lost wake-up). Each service's next one is due at a random point between half
    this and this after its last pass, so services that started together pass apart."""
    peering: str = "llmfleet"
    """kopf peering object: replicas sharing it elect one active operator."""
    metrics_port: int = Field(default=8081, ge=0, le=65535)
    """Port of the operator's /metrics endpoint (0: no endpoint); the gateway has 8080 and the
    autoscaler 8082, so all three run side by side on one machine."""
    metrics_host: str = "127.0.0.1"
    """Address the metrics endpoint binds to: loopback, for a local run; in a pod, `0.0.0.0`
    so that Prometheus can scrape it."""
    probe_in_flight: bool = True
    """Ask draining engines (pod IP, engine port, /metrics) how many requests they still hold;
    off, a demoted pod always drains for the whole period. Against the local kwok cluster, whose
    pod IPs lead nowhere, `LLMFLEET_LOOPBACK_ONLY` refuses each probe before it connects."""
    gateway_url: str = ""
    """The gateway's URL, published as every service's `status.endpoint` (a client names the
    model in its request). Empty: no endpoint is published, and the condition
    EndpointPublished=False says why; a pool Service is never published, as it accepts only the
    gateway's traffic."""
    network_policy: bool = True
    """Give every service a NetworkPolicy (`<name>-engines`): its engine pods accept traffic
    only from the gateway pods, from Prometheus on the engine port (vLLM's /metrics), and, when
    Disaggregated, between its own prefill and decode pods. Off: none (existing ones are
    pruned)."""
    gateway_namespace: str = "llmfleet"
    """Namespace of the gateway pods the NetworkPolicy admits (by its `kubernetes.io/metadata.name`
    label); empty: pods with `gateway_pod_labels` in any namespace."""
    gateway_pod_labels: dict[str, str] = Field(
        default={"app.kubernetes.io/name": "llmfleet", "app.kubernetes.io/component": "gateway"},
        min_length=1,
    )
    """Labels of the gateway pods (all must match; JSON in the environment)."""
    prometheus_namespace: str = "monitoring"
    """Namespace of the Prometheus pods the NetworkPolicy admits to the engine port; empty: any
    namespace."""
    prometheus_pod_labels: dict[str, str] = Field(
        default={"app.kubernetes.io/name": "prometheus"}, min_length=1
    )
    """Labels of the Prometheus pods (all must match; JSON in the environment)."""
    operator_namespace: str = "llmfleet"
    """Namespace of the operator pods the NetworkPolicy admits to the engine port, for the
    in-flight probe of draining engines (`probe_in_flight`); empty: any namespace."""
    operator_pod_labels: dict[str, str] = Field(
        default={"app.kubernetes.io/name": "llmfleet", "app.kubernetes.io/component": "operator"},
        min_length=1,
    )
    """Labels of the operator pods (all must match; JSON in the environment)."""
    service_monitor_labels: dict[str, str] = {}
    """Extra labels on every ServiceMonitor the operator renders: what your Prometheus'
    `serviceMonitorSelector` matches (kube-prometheus-stack selects `release: <its release>`);
    without them its engines are never scraped (JSON in the environment)."""
    metrics_missing_seconds: float = Field(default=300.0, ge=0)
    """How long the autoscaler may find no engine series for a pool with Ready pods
    (`status.autoscaling.metricsMissingSince`) before an autoscaled service says
    MetricsMissing=True."""
    prometheus_url: str = ""
    """Prometheus the canary analysis asks (the engines' and the gateway's metrics, labelled
    by revision); empty: a canary never gets a verdict and holds at its step, saying so."""
    analysis_timeout_seconds: float = Field(default=5.0, gt=0)
    """How long one canary analysis may wait for Prometheus before it counts as unavailable."""
