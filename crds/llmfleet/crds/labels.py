"""Label and annotation keys shared by the operator (writes them) and the gateway (reads them)."""

SERVICE = "llmfleet.dev/service"
"""Name of the InferenceService a child object or pod belongs to."""
POOL = "llmfleet.dev/pool"
"""Pool of a child object or pod: unified, prefill or decode."""
SERVING = "llmfleet.dev/serving"
"""`"true"` on pods that receive traffic, `"false"` on warm spares; pool Services select "true".
A canary's serving pods say `"canary"`: only the canary's own Service selects them."""
SERVING_CANARY = "canary"
"""`llmfleet.dev/serving` of a canary pod that receives the canary's share of the traffic."""
REVISION = "llmfleet.dev/revision"
"""Revision (`status.revision`'s hash) of an engine pod, of its Deployment and of a canary's
Service; Prometheus labels the engines' series with it (`revision`)."""
DEPLOYMENT = "llmfleet.dev/deployment"
"""On the pods of a Deployment named after a revision (`revision_child_name`): its name, in
its selector too, so that two Deployments of one pool never claim each other's pods."""
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "llmfleet-operator"

DEMOTED_AT = "llmfleet.dev/demoted-at"
"""Annotation: when a serving pod was demoted (RFC 3339); it drains until the grace period ends."""
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
"""Kubernetes' annotation: the ReplicaSet deletes pods with the lowest cost first."""
CONFIG_HASH = "llmfleet.dev/config-hash"
"""Pod-template annotation: hash of the runtime config, so a config change rolls the pods."""

OPERATOR_ENV = {
    "LLMFLEET_DRAIN_SECONDS": "the drain grace, which the pod's grace period is sized from",
    "POD_IP": "the pod's address, for the KV-transfer side channel",
    "POD_NAME": "the pod's name, in the launcher's log lines",
    "POD_NAMESPACE": "the pod's namespace, in the launcher's log lines",
}
"""Environment variables the operator sets in every engine container (name -> what it is):
`spec.runtime.env` may not name them (a container's env is a map keyed by name)."""

LAUNCHER_ENV = {
    "VLLM_NIXL_SIDE_CHANNEL_HOST": "the pod's address, where decode pods fetch KV metadata",
    "VLLM_NIXL_SIDE_CHANNEL_PORT": "the KV-transfer side channel's port",
}
"""Environment variables the runtime launcher sets for the engine (name -> what it is): an entry
of `spec.runtime.env` would replace them and break the KV transfer, so admission refuses them."""

ROLLOUT_PAUSE = "llmfleet.dev/rollout-pause"
"""Annotation: `"true"` holds a canary rollout at its step (no analysis, no step advanced);
`"false"` or none resumes it. Admission refuses any other value (`admission_policy`)."""
ROLLOUT_PROMOTE = "llmfleet.dev/rollout-promote"
"""Annotation: a new value (a timestamp, say) promotes the canary in progress at once."""
ROLLOUT_ABORT = "llmfleet.dev/rollout-abort"
"""Annotation: a new value rolls the canary in progress back (weight 0 at once)."""
ROLLOUT_RETRY = "llmfleet.dev/rollout-retry"
"""Annotation: a new value starts the rolled-back revision's canary again from its first step."""

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
NETWORK_POLICY_SUFFIX = "engines"
"""The NetworkPolicy over the service's engine pods: `<service>-engines`."""
CHILD_SUFFIXES = (*POOLS, CONFIG_MAP_SUFFIX, METRICS_SUFFIX, NETWORK_POLICY_SUFFIX)
"""Every suffix the operator appends to a service's name. A child named any other way must add
its suffix here, or a service name at the limit below breaks it."""

REVISION_NAME_CHARACTERS = 6
"""Characters of a revision in the name of a Deployment (and Service) started for it."""


def revision_child_name(service: str, pool: str, revision: str) -> str:
    """Name of the Deployment (and Service) of `pool` started for `revision` by a canary
    rollout: `<service>-<pool's initial><revision's first 6 characters>`, e.g. `chat-u3fa2c1`,
    no longer than `<service>-unified`, so the name limit below holds for it too."""
    return f"{service}-{pool[0]}{revision[:REVISION_NAME_CHARACTERS]}"


DNS_LABEL_MAX_LENGTH = 63
SERVICE_NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
"""A DNS-1035 label (what Kubernetes requires of a Service's name): lowercase letters, digits
and `-`, a letter first, no dots."""
SERVICE_NAME_MAX_LENGTH = DNS_LABEL_MAX_LENGTH - max(
    *(len(pool_service_name("", suffix)) for suffix in CHILD_SUFFIXES),
    *(len(revision_child_name("", pool, "0" * 64)) for pool in POOLS),
)
"""The longest InferenceService name whose every child's name fits 63 characters."""
