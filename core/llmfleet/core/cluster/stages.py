"""What kwok does to the local cluster's nodes and pods: our own Stage set (pure: objects only).

kwok's built-in stages make every pod Ready the moment it is scheduled. A kubelet does not: a pod
with a readiness probe is Ready only once the probe passes, and an engine pod's probe passes only
after the model is loaded. With kwok's stages an engine pod is Ready for a moment before the pod
runner (which starts its engine and owns its readiness) takes that back, and in that moment the
EndpointSlice lists it, the gateway routes to an engine that answers 503 and the operator promotes
a spare that cannot serve yet.

So the local system (`llmfleet up`) gives kwok this set instead, with `runner_owns_engines`:
engine pods (label `llmfleet.dev/pool`) get their IP and phase Running but stay not Ready
(reason `EngineNotStarted`) until the pod runner says otherwise; every other pod is made Ready as
kwok's own stages do. A bare cluster (tests without a pod runner, `llmfleet cluster up`) keeps
every pod Ready at once, as before. kwok uses a configuration's stages instead of all of its
defaults, so the set also carries the node stages and pod deletion.

Template functions (`Now`, `NodeConditions`, `PodIPsWith`, …) and selector syntax are kwok's
(v0.8, `sigs.k8s.io/kwok/pkg/utils/lifecycle` and `kustomize/stage/`).
"""

from __future__ import annotations

from typing import Any

ENGINE_POOL_LABEL = "llmfleet.dev/pool"
"""Engine pods carry it (the operator's pool label); nothing else does."""
ENGINE_NOT_STARTED = "EngineNotStarted"

_NODE_HEARTBEAT_MS = 600_000
"""kwok renews node leases itself; the node's status is refreshed only every ~10 min (as kwok's
own lease-based heartbeat stage does), which is enough for the node lifecycle controller."""

_NODE_STATUS = """\
{{ $now := Now }}
{{ $since := or .metadata.creationTimestamp $now }}
conditions:
{{ range NodeConditions }}
- type: {{ .type | Quote }}
  status: {{ .status | Quote }}
  reason: {{ .reason | Quote }}
  message: {{ .message | Quote }}
  lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $since | Quote }}
{{ end }}
addresses:
{{ with NodeIP }}
- type: InternalIP
  address: {{ . | Quote }}
{{ end }}
{{ with NodeName }}
- type: Hostname
  address: {{ . | Quote }}
{{ end }}
{{ with NodePort }}
daemonEndpoints:
  kubeletEndpoint:
    Port: {{ . }}
{{ end }}
"""

# Values a node already has (ours set the kubelet version) are kept: kwok may initialise a node
# before our status is applied, and a value of its own would then conflict with ours.
_NODE_INFO = """\
{{ $info := .status.nodeInfo }}
{{ $version := printf "kwok-%s" Version }}
nodeInfo:
  architecture: {{ or $info.architecture "amd64" | Quote }}
  operatingSystem: {{ or $info.operatingSystem "linux" | Quote }}
  containerRuntimeVersion: {{ or $info.containerRuntimeVersion $version | Quote }}
  kernelVersion: {{ or $info.kernelVersion $version | Quote }}
  kubeProxyVersion: {{ or $info.kubeProxyVersion $version | Quote }}
  kubeletVersion: {{ or $info.kubeletVersion $version | Quote }}
  bootID: {{ or $info.bootID "" | Quote }}
  machineID: {{ or $info.machineID "" | Quote }}
  osImage: {{ or $info.osImage "" | Quote }}
  systemUUID: {{ or $info.systemUUID "" | Quote }}
phase: Running
"""

_POD_RUNNING = """\
{{ $now := Now }}
{{ $ready := "%(ready)s" }}
conditions:
- type: Initialized
  status: "True"
  lastTransitionTime: {{ $now | Quote }}
- type: Ready
  status: {{ $ready | Quote }}
  %(reason)s
  lastTransitionTime: {{ $now | Quote }}
- type: ContainersReady
  status: {{ $ready | Quote }}
  %(reason)s
  lastTransitionTime: {{ $now | Quote }}
{{ range .spec.readinessGates }}
- type: {{ .conditionType | Quote }}
  status: "True"
  lastTransitionTime: {{ $now | Quote }}
{{ end }}
containerStatuses:
{{ range .spec.containers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: %(container_ready)s
  started: %(container_ready)s
  restartCount: 0
  state:
    %(container_state)s
{{ end }}
initContainerStatuses:
{{ range .spec.initContainers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: true
  restartCount: 0
  state:
    terminated:
      exitCode: 0
      reason: Completed
      startedAt: {{ $now | Quote }}
      finishedAt: {{ $now | Quote }}
{{ end }}
{{ with NodeIPsWith .spec.nodeName }}
hostIP: {{ index . 0 | Quote }}
hostIPs:
{{ range . }}
- ip: {{ . | Quote }}
{{ end }}
{{ end }}
{{ with %(pod_ips)s }}
podIP: {{ index . 0 | Quote }}
podIPs:
{{ range . }}
- ip: {{ . | Quote }}
{{ end }}
{{ end }}
phase: Running
startTime: {{ $now | Quote }}
"""

_POD_IPS = (
    'PodIPsWith .spec.nodeName (or .spec.hostNetwork false) (or .metadata.uid "")'
    ' (or .metadata.name "") (or .metadata.namespace "")'
)
READY_POD_STATUS = _POD_RUNNING % {
    "pod_ips": _POD_IPS,
    "ready": "True",
    "reason": "",
    "container_ready": "true",
    "container_state": "running: {startedAt: {{ $now | Quote }}}",
}
ENGINE_POD_STATUS = _POD_RUNNING % {
    "pod_ips": _POD_IPS,
    "ready": "False",
    "reason": f"reason: {ENGINE_NOT_STARTED}\n  message: the pod runner has not started its engine",
    "container_ready": "false",
    "container_state": f"waiting: {{reason: {ENGINE_NOT_STARTED}}}",
}


def _stage(
    name: str, kind: str, expressions: list[dict[str, Any]], next_: dict[str, Any], **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Stage",
        "metadata": {"name": name},
        "spec": {
            "resourceRef": {"apiGroup": "v1", "kind": kind},
            "selector": {"matchExpressions": expressions},
            "next": next_,
            **spec,
        },
    }


def _is(key: str, operator: str, *values: str) -> dict[str, Any]:
    expression: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        expression["values"] = list(values)
    return expression


_NOT_DELETED = _is(".metadata.deletionTimestamp", "DoesNotExist")
_PENDING = _is(".status.phase", "In", "Pending")
_READY = '.status.conditions.[] | select( .type == "Ready" ) | .status'
_ENGINE = f'.metadata.labels["{ENGINE_POOL_LABEL}"]'


def stages(*, runner_owns_engines: bool) -> list[dict[str, Any]]:
    """The Stage objects for kwokctl's configuration (see the module's docstring)."""
    start_pod = [_NOT_DELETED, _PENDING, _is(_READY, "NotIn", "True")]
    if runner_owns_engines:
        pod_stages = [
            _stage("pod-ready", "Pod", [*start_pod, _is(_ENGINE, "DoesNotExist")],
                   {"statusTemplate": READY_POD_STATUS}),
            _stage("engine-pod-running", "Pod", [*start_pod, _is(_ENGINE, "Exists")],
                   {"statusTemplate": ENGINE_POD_STATUS}),
        ]  # fmt: skip
    else:
        pod_stages = [_stage("pod-ready", "Pod", start_pod, {"statusTemplate": READY_POD_STATUS})]
    return [
        _stage("node-initialize", "Node", [_is(_READY, "NotIn", "True")],
               {"statusTemplate": _NODE_STATUS + _NODE_INFO}),
        _stage("node-heartbeat", "Node",
               [_is(".status.phase", "In", "Running"), _is(_READY, "In", "True")],
               {"statusTemplate": _NODE_STATUS},
               delay={"durationMilliseconds": _NODE_HEARTBEAT_MS,
                      "jitterDurationMilliseconds": _NODE_HEARTBEAT_MS + 10_000}),
        *pod_stages,
        _stage("pod-complete", "Pod",
               [_NOT_DELETED, _is(".status.phase", "In", "Running"),
                _is(".metadata.ownerReferences.[].kind", "In", "Job")],
               {"statusTemplate": JOB_POD_DONE}),
        _stage("pod-delete", "Pod", [_is(".metadata.deletionTimestamp", "Exists")],
               {"delete": True}),
    ]  # fmt: skip


JOB_POD_DONE = """\
{{ $now := Now }}
containerStatuses:
{{ range .spec.containers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: false
  started: false
  restartCount: 0
  state:
    terminated:
      exitCode: 0
      reason: Completed
      startedAt: {{ $now | Quote }}
      finishedAt: {{ $now | Quote }}
{{ end }}
phase: Succeeded
"""
