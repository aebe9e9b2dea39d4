"""The Kubernetes objects one InferenceService owns, as manifests (pure).

Per service: a ConfigMap with each pool's runtime config, a headless metrics Service (and
a ServiceMonitor on it when the Prometheus Operator is installed) and a NetworkPolicy over its
engine pods. Per pool: a Deployment of engine pods, a Service that selects only serving pods,
and a PodDisruptionBudget.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from llmfleet.crds import API_VERSION, KIND, InferenceService
from llmfleet.crds import labels as L
from llmfleet.crds.gpus import GPU_RESOURCE
from llmfleet.operator import engine_pod
from llmfleet.operator.settings import OperatorSettings

CONFIG_DIR = "/etc/llmfleet/runtime"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
"""Set by Kubernetes on every namespace to its name: how a NetworkPolicy names a namespace."""
KV_TRANSFER_POOLS = ("prefill", "decode")
METRICS_LABEL = "llmfleet.dev/metrics"
POD_ONLY_RUNTIME_FIELDS = ("env", "envFrom", "imagePullSecrets", "resources", "shmSize")
"""`spec.runtime` fields the operator puts on the pod and never into the runtime ConfigMap:
the launcher has no use for them, and an env entry's value (or its reference) has no place in
a ConfigMap that anyone who may read ConfigMaps can read."""
ENGINE_STARTUP_SECONDS = 1800
"""How long the startup probe lets vLLM load before its /health must answer: the launcher's own
startup timeout (`serving.startupTimeoutSeconds`), which ends a stuck load with an exit code
that says so; the kubelet must not kill the pod first."""
STARTUP_PROBE_PERIOD_SECONDS = 10
Manifest = dict[str, Any]


def child_name(service: InferenceService, pool: str | None = None) -> str:
    name = str(service.metadata["name"])
    return L.pool_service_name(name, pool) if pool else name


def _meta(service: InferenceService, name: str, pool: str | None = None) -> dict[str, Any]:
    labels = {L.SERVICE: service.metadata["name"], L.MANAGED_BY: L.MANAGED_BY_VALUE}
    if pool:
        labels[L.POOL] = pool
    return {
        "name": name,
        "namespace": service.metadata["namespace"],
        "labels": labels,
        "ownerReferences": [
            {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": service.metadata["name"],
                "uid": service.metadata["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }


def runtime_config(service: InferenceService, pool: str) -> dict[str, Any]:
    """What the launcher in a pod of `pool` reads (camelCase, like the spec it comes from)."""
    spec = service.spec
    config: dict[str, Any] = {
        "service": service.metadata["name"],
        "namespace": service.metadata["namespace"],
        "role": pool,
        "port": L.ENGINE_PORT,
        "launcherPort": L.LAUNCHER_PORT,
        "model": spec.model.to_wire() | {"servedName": spec.served_name},
        "runtime": {
            key: value
            for key, value in spec.runtime.to_wire().items()
            if key not in POD_ONLY_RUNTIME_FIELDS
        },
        "slo": spec.slo.to_wire(),
    }
    if spec.topology.kv_transfer is not None:
        config["kvTransfer"] = spec.topology.kv_transfer.to_wire()
    return config


def _config_text(service: InferenceService, pool: str) -> str:
    return json.dumps(runtime_config(service, pool), sort_keys=True, indent=2) + "\n"


def config_map(service: InferenceService, retiring: Mapping[str, str] | None = None) -> Manifest:
    """The runtime configs of the spec's pools, and the `retiring` ones (file name -> text) of
    pools a topology change retires: their engines may restart before they are gone."""
    data = dict(retiring or {})
    data |= {f"{pool}.json": _config_text(service, pool) for pool in service.spec.pools()}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(service, child_name(service, "runtime")),
        "data": data,
    }


def config_text(service: InferenceService, pool: str) -> str:
    """The runtime config file of `pool` as `service`'s spec makes it (what the ConfigMap
    holds under the key of each Deployment of the pool, `config_key`)."""
    return _config_text(service, pool)


def config_key(service: InferenceService, deployment_name: str) -> str:
    """The ConfigMap key a Deployment's pods read: `<pool>.json` for `<service>-<pool>`,
    `<suffix>.json` for a Deployment named after a revision (`<service>-<suffix>`)."""
    prefix = f"{service.metadata['name']}-"
    return f"{deployment_name.removeprefix(prefix)}.json"


def deployment(
    service: InferenceService,
    pool: str,
    replicas: int,
    settings: OperatorSettings,
    surge: int = 1,
    *,
    name: str | None = None,
    revision: str = "",
) -> Manifest:
    """The pool's Deployment. A rolling update starts `surge` extra pods (one; none when the
    GPU budget has no room, and then takes one pod down at a time instead).

    A Deployment started for a revision by a canary rollout has its own `name`
    (`labels.revision_child_name`): its selector and pods carry `llmfleet.dev/deployment`, so
    it never claims the pool's other Deployment's pods, and its pods carry the `revision`."""
    spec = service.spec
    pool_spec = spec.pools()[pool]
    name = name or child_name(service, pool)
    selector = {L.SERVICE: service.metadata["name"], L.POOL: pool}
    pod_labels: dict[str, str] = {}
    if name != child_name(service, pool):
        selector[L.DEPLOYMENT] = name
        pod_labels[L.REVISION] = revision
    config_hash = hashlib.sha256(_config_text(service, pool).encode()).hexdigest()[:16]
    node_selector = dict(pool_spec.node_selector)
    tolerations = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    tolerations += [toleration.to_wire() for toleration in pool_spec.tolerations]
    container: dict[str, Any] = {
        "name": "engine",
        "image": spec.runtime.image or settings.runtime_image,
        "command": [
            "llmfleet-runtime",
            "serve",
            "--config",
            f"{CONFIG_DIR}/{config_key(service, name)}",
        ],
        # `http` is vLLM itself (the Services target it); `launcher` carries no requests.
        "ports": [
            {"name": "http", "containerPort": L.ENGINE_PORT, "protocol": "TCP"},
            {"name": "launcher", "containerPort": L.LAUNCHER_PORT, "protocol": "TCP"},
        ],
        "env": engine_pod.env(service, settings),
        "resources": engine_pod.resources(service),
        "securityContext": engine_pod.container_security_context(),
        "volumeMounts": [
            {"name": "runtime-config", "mountPath": CONFIG_DIR, "readOnly": True},
            *engine_pod.volume_mounts(service),
        ],
        # Ready only after the engine is healthy and warmed up, and no longer once it drains
        # (the launcher decides, on its side port).
        "readinessProbe": {
            "httpGet": {"path": "/ready", "port": "launcher"},
            "periodSeconds": 2,
        },
        # vLLM's own /health: 503 once its engine core is dead; no answer in 5 s, hung.
        "livenessProbe": {
            "httpGet": {"path": "/health", "port": "http"},
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 6,
        },
        # Model load and CUDA-graph capture take minutes; liveness starts counting after it.
        "startupProbe": {
            "httpGet": {"path": "/health", "port": "http"},
            "periodSeconds": STARTUP_PROBE_PERIOD_SECONDS,
            "failureThreshold": ENGINE_STARTUP_SECONDS // STARTUP_PROBE_PERIOD_SECONDS,
        },
        # The drain: the launcher turns not ready (the EndpointSlices drop the pod) and answers
        # once vLLM has nothing in flight or LLMFLEET_DRAIN_SECONDS have passed; SIGTERM after.
        "lifecycle": {"preStop": {"httpGet": {"path": "/drain", "port": "launcher"}}},
    }
    env_from = engine_pod.env_from(service)
    if env_from:
        container["envFrom"] = env_from
    pod_spec: dict[str, Any] = {
        # The preStop drain (LLMFLEET_DRAIN_SECONDS at most), then vLLM's exit after SIGTERM
        # (the launcher's engineStopSeconds, 10), with room to spare.
        "terminationGracePeriodSeconds": settings.drain_seconds + 30,
        "securityContext": engine_pod.pod_security_context(settings),
        # The engine talks to no Kubernetes API.
        "automountServiceAccountToken": False,
        "nodeSelector": node_selector,
        "affinity": engine_pod.gpu_affinity(spec.runtime.gpu),
        "tolerations": tolerations,
        "containers": [container],
        "volumes": [
            {"name": "runtime-config", "configMap": {"name": child_name(service, "runtime")}},
            *engine_pod.volumes(service),
        ],
    }
    pull_secrets = engine_pod.image_pull_secrets(service, settings)
    if pull_secrets:
        pod_spec["imagePullSecrets"] = pull_secrets
    metadata = _meta(service, name, pool)
    if revision:
        metadata["labels"][L.REVISION] = revision
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector},
            "strategy": {
                "type": "RollingUpdate",
                # Never below capacity during a rollout while the budget allows one extra pod at
                # a time (GPUs are dear); without room, one pod down at a time.
                "rollingUpdate": {"maxSurge": surge, "maxUnavailable": 0 if surge else 1},
            },
            "template": {
                "metadata": {
                    # New pods start as spares; the operator promotes them once Ready.
                    "labels": selector | pod_labels | {L.SERVING: "false"},
                    "annotations": {L.CONFIG_HASH: config_hash},
                },
                "spec": pod_spec,
            },
        },
    }


HEADLESS = "None"
"""`spec.clusterIP` of the pool and canary Services. Nothing connects to their address: the
gateway reads their EndpointSlices and connects to pod IPs, Prometheus scrapes through the
metrics Service, the local system's relays reach only the gateway's Service. Without one, a
service costs no address of the cluster's Service range and no kube-proxy rules on every
node. A Service created with an address keeps it (`drift.kept_immutable`): the field cannot
change once set."""


def pool_service(service: InferenceService, pool: str) -> Manifest:
    """The pool's Service (headless): serving pods only, straight to vLLM's port (`http`). The
    gateway reads its EndpointSlices, whose port keeps the Service port's name, `http`."""
    selector = {L.SERVICE: service.metadata["name"], L.POOL: pool, L.SERVING: "true"}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(service, child_name(service, pool), pool),
        "spec": {
            "clusterIP": HEADLESS,
            "selector": selector,
            "ports": [{"name": "http", "port": L.ENGINE_PORT, "targetPort": "http"}],
        },
    }


def canary_service(service: InferenceService, pool: str, name: str, revision: str) -> Manifest:
    """A canary's Service (headless) for one pool, named as its Deployment: the canary's
    serving pods (`llmfleet.dev/serving: canary`) only, so the pool Service never sees them.
    The gateway sends the canary's share of the traffic to its EndpointSlices."""
    selector = {L.SERVICE: service.metadata["name"], L.POOL: pool, L.DEPLOYMENT: name,
                L.SERVING: L.SERVING_CANARY}  # fmt: skip
    metadata = _meta(service, name, pool)
    metadata["labels"][L.REVISION] = revision
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {
            "clusterIP": HEADLESS,
            "selector": selector,
            "ports": [{"name": "http", "port": L.ENGINE_PORT, "targetPort": "http"}],
        },
    }


def disruption_budget(service: InferenceService, pool: str) -> Manifest:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(service, child_name(service, pool), pool),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": {L.SERVICE: service.metadata["name"], L.POOL: pool}},
        },
    }


def metrics_service(service: InferenceService) -> Manifest:
    """Headless Service over every engine pod, spares included, for Prometheus to scrape vLLM's
    own /metrics on its port (`http`)."""
    metadata = _meta(service, child_name(service, "metrics"))
    metadata["labels"][METRICS_LABEL] = "true"
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {
            "clusterIP": "None",
            "selector": {L.SERVICE: service.metadata["name"]},
            "ports": [{"name": "http", "port": L.ENGINE_PORT, "targetPort": "http"}],
        },
    }


def service_monitor(service: InferenceService, settings: OperatorSettings) -> Manifest:
    """The ServiceMonitor of the service's metrics Service, with `service_monitor_labels` (what
    a Prometheus selects ServiceMonitors by) beside the operator's own."""
    metadata = _meta(service, child_name(service, "metrics"))
    metadata["labels"] = dict(settings.service_monitor_labels) | metadata["labels"]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": metadata,
        "spec": {
            "selector": {
                "matchLabels": {L.SERVICE: service.metadata["name"], METRICS_LABEL: "true"}
            },
            "endpoints": [
                {
                    "port": "http",
                    "path": "/metrics",
                    "interval": "15s",
                    # The canary analysis tells revisions apart by `revision` (local file
                    # discovery names it so too).
                    "relabelings": [
                        {
                            "sourceLabels": ["__meta_kubernetes_pod_label_llmfleet_dev_revision"],
                            "targetLabel": "revision",
                        }
                    ],
                }
            ],
            "podTargetLabels": [L.SERVICE, L.POOL],
        },
    }


def _peer(namespace: str, pod_labels: dict[str, str]) -> dict[str, Any]:
    """Pods with all of `pod_labels` in `namespace` (any namespace when empty)."""
    namespaces = {"matchLabels": {NAMESPACE_NAME_LABEL: namespace}} if namespace else {}
    return {"podSelector": {"matchLabels": dict(pod_labels)}, "namespaceSelector": namespaces}


def network_policy(
    service: InferenceService, settings: OperatorSettings, kv_transfer: bool
) -> Manifest:
    """Ingress to the service's engine pods (spares and draining pods too): the gateway pods,
    Prometheus and (with `probe_in_flight`) the operator pods, which ask draining engines how
    many requests they hold, all on the engine port only (vLLM serves its API and /metrics
    there); with
    `kv_transfer`, also the service's own prefill and decode pods from each other, on every
    port. Egress stays open (engines fetch their models).

    NOTE: KV transfer cannot be held to one port: NIXL's handshake listens on the launcher's
    side-channel port (5600 by default, `VLLM_NIXL_SIDE_CHANNEL_PORT`), but UCX's TCP transport
    then moves the KV blocks over ports it picks at run time, and LMCache's ports are its own
    configuration. (Over RDMA the transfer bypasses the kernel's network stack, where
    NetworkPolicies are enforced, altogether.) So the peer is narrow instead: only this
    service's pods of those two pools.

    Traffic from the pod's own node (the kubelet's probes of both ports) is always allowed by
    NetworkPolicy semantics, so no rule is needed for it."""
    name = service.metadata["name"]
    engine_port = [{"protocol": "TCP", "port": L.ENGINE_PORT}]
    rules: list[dict[str, Any]] = [
        {"from": [_peer(settings.gateway_namespace, settings.gateway_pod_labels)],
         "ports": engine_port},
        {"from": [_peer(settings.prometheus_namespace, settings.prometheus_pod_labels)],
         "ports": engine_port},
    ]  # fmt: skip
    if settings.probe_in_flight:
        rules.append(
            {"from": [_peer(settings.operator_namespace, settings.operator_pod_labels)],
             "ports": engine_port}
        )  # fmt: skip
    if kv_transfer:
        siblings = {
            "matchLabels": {L.SERVICE: name},
            "matchExpressions": [
                {"key": L.POOL, "operator": "In", "values": list(KV_TRANSFER_POOLS)}
            ],
        }
        rules.append({"from": [{"podSelector": siblings}]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(service, child_name(service, L.NETWORK_POLICY_SUFFIX)),
        "spec": {
            "podSelector": {"matchLabels": {L.SERVICE: name}},
            "policyTypes": ["Ingress"],
            "ingress": rules,
        },
    }
