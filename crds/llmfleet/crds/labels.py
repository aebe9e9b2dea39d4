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
"""Port of the engine's OpenAI-compatible API (and /metrics) in every engine pod."""


def pool_service_name(service: str, pool: str) -> str:
    """Name of the Service (and Deployment, PDB) of one pool of an InferenceService."""
    return f"{service}-{pool}"
