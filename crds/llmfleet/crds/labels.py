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
