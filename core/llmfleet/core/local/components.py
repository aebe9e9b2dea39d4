"""llmfleet's own component pods on the local system: what a kubelet would run for the Helm
chart's operator, autoscaler and gateway pods (`llmfleet up --chart`).

kwok runs nothing inside pods, so the pod runner starts each running component pod's command
(`llmfleet operator|autoscaler|gateway`) as a process with the pod's own environment and a
kubeconfig that authenticates with a token of the pod's ServiceAccount (TokenRequest, as the
kubelet mounts one): whatever the component does, the API server allows only what the chart's
RBAC grants that account. The process keeps its pod's readiness as a readiness probe would (the
container's `httpGet` probe) and is restarted when it exits.

What is local here, and said so: the process runs in the local system's network namespace (it
reaches the API server and Prometheus on its 127.0.0.1, the engines on their pod IPs, and the
user reaches the gateway through the system's relayed port), so the chart values `llmfleet up
--chart` installs put the gateway and the metrics on the system's ports; the loopback guard's
environment is added to the pod's (every process of the local system runs under it).
"""

from __future__ import annotations

import base64
import logging
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from llmfleet.core import loopback
from llmfleet.core.local import podnet, processes
from llmfleet.core.local.processes import RESTART_BACKOFF_MAX

log = logging.getLogger("llmfleet.podrunner")

NAME_LABEL = "app.kubernetes.io/name"
COMPONENT_LABEL = "app.kubernetes.io/component"
COMPONENTS = ("operator", "autoscaler", "gateway")
SELECTOR = f"{COMPONENT_LABEL} in ({','.join(COMPONENTS)}),{NAME_LABEL}"
TOKEN_SECONDS = 86_400
"""A day: the components read their kubeconfig once, and a local system rarely runs longer."""


class PodSpecError(ValueError):
    """The pod cannot be run here (its command is not llmfleet's, a reference is missing)."""


@dataclass(frozen=True)
class ComponentPod:
    """What the runner needs of one component pod."""

    uid: str
    namespace: str
    name: str
    component: str
    account: str
    argv: tuple[str, ...]
    """The container's command and args, `llmfleet` first."""
    env: tuple[tuple[str, str], ...]
    ready_path: str | None
    ready_port: int | None
    ready: bool | None


def argv_of(container: Any) -> tuple[str, ...]:
    command = [*(container.command or []), *(container.args or [])]
    if not command or Path(command[0]).name != "llmfleet":
        raise PodSpecError(f"runs {command[:1] or 'its image entrypoint'}, not `llmfleet`")
    return tuple(command)


def _probe_port(container: Any) -> tuple[str | None, int | None]:
    probe = container.readiness_probe
    if probe is None or probe.http_get is None:
        return None, None
    port = probe.http_get.port
    if isinstance(port, str) and not port.isdigit():
        named = {p.name: p.container_port for p in container.ports or []}
        if port not in named:
            raise PodSpecError(f"its readiness probe names port {port!r}, which it does not have")
        return probe.http_get.path or "/", named[port]
    return probe.http_get.path or "/", int(port)


def _env_value(core: client.CoreV1Api, pod: Any, entry: Any) -> str:
    # Pods are typed Any here as in podrunner.py: the client's models make every field optional.
    """An env entry's value, resolving `valueFrom` as the kubelet does."""
    source = entry.value_from
    if source is None:
        return entry.value or ""
    namespace = pod.metadata.namespace
    if source.field_ref is not None:
        fields = {
            "metadata.namespace": namespace,
            "metadata.name": pod.metadata.name,
            "spec.serviceAccountName": pod.spec.service_account_name or "default",
            "status.podIP": (pod.status.pod_ip if pod.status else None) or "",
        }
        path = source.field_ref.field_path
        if path not in fields:
            raise PodSpecError(f"env {entry.name}: fieldRef {path} is not supported here")
        return str(fields[path])
    if source.secret_key_ref is not None:
        secret: Any = source.secret_key_ref
        data = core.read_namespaced_secret(secret.name, namespace).data or {}
        if secret.key not in data:
            raise PodSpecError(f"env {entry.name}: secret {secret.name} has no key {secret.key}")
        return base64.b64decode(data[secret.key]).decode()
    if source.config_map_key_ref is not None:
        ref: Any = source.config_map_key_ref
        values = core.read_namespaced_config_map(ref.name, namespace).data or {}
        if ref.key not in values:
            raise PodSpecError(f"env {entry.name}: config map {ref.name} has no key {ref.key}")
        return str(values[ref.key])
    raise PodSpecError(f"env {entry.name}: this kind of valueFrom is not supported here")


def component_pod(core: client.CoreV1Api, pod: Any) -> ComponentPod | None:
    """The pod's view, or None when it is not running (yet) or is going away."""
    meta, spec, status = pod.metadata, pod.spec, pod.status
    if meta.deletion_timestamp is not None or status is None or status.phase != "Running":
        return None
    container = spec.containers[0]
    path, port = _probe_port(container)
    ready = next((c.status == "True" for c in status.conditions or [] if c.type == "Ready"), None)
    return ComponentPod(
        uid=meta.uid,
        namespace=meta.namespace,
        name=meta.name,
        component=(meta.labels or {}).get(COMPONENT_LABEL, ""),
        account=spec.service_account_name or "default",
        argv=argv_of(container),
        env=tuple((e.name, _env_value(core, pod, e)) for e in container.env or []),
        ready_path=path,
        ready_port=port,
        ready=ready,
    )


def token_kubeconfig(
    core: client.CoreV1Api, admin: Mapping[str, Any], namespace: str, account: str
) -> dict[str, Any]:
    """A kubeconfig for the cluster of the `admin` kubeconfig that authenticates with a fresh
    token of ServiceAccount `namespace/account`."""
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=TOKEN_SECONDS)
    )
    answer: Any = core.create_namespaced_service_account_token(account, namespace, request)
    token = answer.status.token
    context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])
    cluster = next(c for c in admin["clusters"] if c["name"] == context["context"]["cluster"])
    user = f"system:serviceaccount:{namespace}:{account}"
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": user, "context": {"cluster": cluster["name"], "user": user}}],
        "current-context": user,
    }


@dataclass
class Component:
    """The process of one component pod."""

    pod: ComponentPod
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    next_start: float = 0.0
    token_at: float = 0.0
    healthy: bool = False
    error: str = ""

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


class ComponentRunner:
    """Runs the component pods; `reconcile` once per pod runner pass."""

    def __init__(
        self,
        core: client.CoreV1Api,
        admin_kubeconfig: Path,
        work_dir: Path,
        probe: Any,
        stop_grace: float = 10.0,
    ) -> None:
        self.core = core
        self.admin = yaml.safe_load(admin_kubeconfig.read_text())
        self.work_dir = work_dir
        self.probe = probe
        self.stop_grace = stop_grace
        self.components: dict[str, Component] = {}
        work_dir.mkdir(parents=True, exist_ok=True)

    def reconcile(self) -> None:
        listing = self.core.list_pod_for_all_namespaces(label_selector=SELECTOR)
        wanted: dict[str, ComponentPod] = {}
        pod: Any
        for pod in listing.items:
            try:
                view = component_pod(self.core, pod)
            except (PodSpecError, client.ApiException) as error:
                log.warning("%s/%s: cannot run it: %s", pod.metadata.namespace,
                            pod.metadata.name, error)  # fmt: skip
                continue
            if view is not None:
                wanted[view.uid] = view
        for uid in [uid for uid in self.components if uid not in wanted]:
            self._stop(self.components.pop(uid), "its pod is gone")
        now = time.monotonic()
        for uid, view in wanted.items():
            component = self.components.get(uid)
            if component is None:
                log_path = self.work_dir / f"{view.namespace}_{view.name}.log"
                component = self.components[uid] = Component(view, log_path)
            component.pod = view
            if component.process is not None and not component.alive():
                self._exited(component, now)
            if component.process is None and now >= component.next_start:
                self._start(component, now)
            component.healthy = component.alive() and (
                view.ready_port is None
                or self.probe(f"http://127.0.0.1:{view.ready_port}{view.ready_path}")
            )
            if view.ready != component.healthy:
                self._set_ready(component)

    def close(self) -> None:
        for component in self.components.values():
            self._stop(component, "the pod runner stops")
        self.components.clear()

    def _start(self, component: Component, now: float) -> None:
        view = component.pod
        config = self.work_dir / f"{view.namespace}_{view.name}.kubeconfig"
        try:
            kubeconfig = token_kubeconfig(self.core, self.admin, view.namespace, view.account)
        except client.ApiException as error:
            component.error = f"no token for {view.account}: {error.reason}"
            component.next_start = now + RESTART_BACKOFF_MAX
            log.warning("%s/%s: %s", view.namespace, view.name, component.error)
            return
        config.write_text(yaml.safe_dump(kubeconfig))
        config.chmod(0o600)
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("LLMFLEET_")}
        env = inherited | dict(view.env)
        env |= {
            "KUBECONFIG": str(config),
            loopback.ENV: "true",
            loopback.NETWORKS_ENV: podnet.POD_NETWORK,
            "PYTHONUNBUFFERED": "1",
        }
        argv = [sys.executable, "-m", "llmfleet.core.cli", *view.argv[1:]]
        with component.log_path.open("ab") as out:
            component.process = subprocess.Popen(
                argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=False
            )
        log.info(
            "%s/%s: %s started as %s (pid %d)%s",
            view.namespace, view.name, view.component, view.account, component.process.pid,
            f", restart {component.restarts}" if component.restarts else "",
        )  # fmt: skip

    def _exited(self, component: Component, now: float) -> None:
        assert component.process is not None
        code = component.process.returncode
        component.process = None
        component.restarts += 1
        backoff = processes.restart_backoff(component.restarts)
        component.next_start = now + backoff
        component.error = f"exited with {code}"
        view = component.pod
        log.warning("%s/%s: %s exited with %s; restarting in %.0fs (see %s)",
                    view.namespace, view.name, view.component, code, backoff,
                    component.log_path)  # fmt: skip

    def _stop(self, component: Component, why: str) -> None:
        if component.alive():
            log.info("%s/%s: stopping it (%s)", component.pod.namespace, component.pod.name, why)
        processes.stop(component.process, self.stop_grace)
        component.process = None

    def _set_ready(self, component: Component) -> None:
        view = component.pod
        if component.healthy:
            reason, message = "ComponentReady", "its readiness probe passes"
        elif component.alive():
            reason, message = "ComponentNotReady", "starting, or its readiness probe fails"
        else:
            reason, message = "ComponentNotRunning", component.error or "not running"
        status = "True" if component.healthy else "False"
        conditions = [
            {"type": kind, "status": status, "reason": reason, "message": message}
            for kind in ("Ready", "ContainersReady")
        ]
        try:
            self.core.patch_namespaced_pod_status(
                view.name, view.namespace, {"status": {"conditions": conditions}}
            )
        except client.ApiException as error:
            if error.status != 404:
                log.warning("%s/%s: cannot set Ready: %s", view.namespace, view.name, error.reason)
            return
        log.info("%s/%s: Ready=%s (%s)", view.namespace, view.name, status, reason)
