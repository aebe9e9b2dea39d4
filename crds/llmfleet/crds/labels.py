"""Label and annotation keys shared by the operator (writes them) and the gateway (reads them)."""

SERVICE = "llmfleet.dev/service"
"""Name of the InferenceService a child object or pod belongs to."""
POOL = "llmfleet.dev/pool"
"""Pool of a child object or pod: unified, prefill or decode."""
SERVING = "llmfleet.dev/serving"
"""`"true"` on pods that receive traffic, `"false"` on warm spares; pool Services select "true"."""
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "llmfleet-operator"

DEMOTED_AT = "llmfleet.dev/demoted-at"
"""Annotation: when a serving pod was demoted (RFC 3339); it drains until the grace period ends."""
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
"""Kubernetes' annotation: the ReplicaSet deletes pods with the lowest cost first."""
CONFIG_HASH = "llmfleet.dev/config-hash"
"""Pod-template annotation: hash of the runtime config, so a config change rolls the pods."""

ENGINE_PORT = 8000
"""Port of the engine's own OpenAI-compatible API (and /health, /metrics) in every engine pod,
named `http`: the pool Services target it directly, so a request crosses no proxy in the pod."""
LAUNCHER_PORT = 8001
"""The runtime launcher's side port in every engine pod, named `launcher`: readiness (`/ready`)
and the drain (`/drain`, the preStop hook). It carries no requests."""


def pool_service_name(service: str, pool: str) -> str:
    """Name of the Service (and Deployment, PDB) of one pool of an InferenceService."""
    return f"{service}-{pool}"


# Names of the children. Every child of an InferenceService is named `<service>-<suffix>`, and
# Services must be DNS-1035 labels (63 characters, a letter first), so the service's own name
# is limited by the longest suffix: admission refuses a name the children could not carry.
POOLS = ("unified", "prefill", "decode")
"""Pool names: each pool's Deployment, Service and PodDisruptionBudget are `<service>-<pool>`."""
CONFIG_MAP_SUFFIX = "runtime"
"""The ConfigMap with each pool's runtime config: `<service>-runtime`."""
METRICS_SUFFIX = "metrics"
"""The headless metrics Service and its ServiceMonitor: `<service>-metrics`."""
CHILD_SUFFIXES = (*POOLS, CONFIG_MAP_SUFFIX, METRICS_SUFFIX)
"""Every suffix the operator appends to a service's name. A child named any other way must add
its suffix here, or a service name at the limit below breaks it."""

DNS_LABEL_MAX_LENGTH = 63
SERVICE_NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
"""A DNS-1035 label (what Kubernetes requires of a Service's name): lowercase letters, digits
and `-`, a letter first, no dots."""
SERVICE_NAME_MAX_LENGTH = DNS_LABEL_MAX_LENGTH - max(
    len(pool_service_name("", suffix)) for suffix in CHILD_SUFFIXES
)
"""The longest InferenceService name whose every child's name fits 63 characters."""
