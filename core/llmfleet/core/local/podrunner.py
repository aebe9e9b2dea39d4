"""The pod runner: what the kubelet and the container runtime would do for the local cluster's
engine pods.

kwok schedules engine pods onto fake GPU nodes, gives them IPs and marks them Running, but runs
nothing. Every `interval` the runner lists the engine pods (label `llmfleet.dev/pool`) and:
- starts one llm-d-inference-sim per running pod (engines.py reads the pod's runtime config
  from its ConfigMap), in a network namespace of its own that carries the pod IP (podnet.py);
- probes each engine's `/health/ready` on its pod IP, as a readiness probe would, and keeps
  the pod's `Ready` condition equal to the answer: a pod whose engine is starting, dead or not
  answering is not Ready, so the EndpointSlice controller, the operator and the gateway stop
  sending it requests;
- restarts an engine that exited (backing off 1 s, 2 s, … 10 s) and counts the restarts;
- stops the engine of a pod that is deleted or gone (SIGTERM, SIGKILL after `stop_grace`);
- writes the Prometheus file-discovery targets of the running engines, labelled as the
  ServiceMonitor labels real pods (namespace, service, pool, pod, revision);
- with a real node (`llmfleet up --real-node`), leaves the pods the kubelet runs alone (their IPs
  are on the real node's bridge) but writes their Prometheus targets too (kubelet_targets.py).

It keeps no state that a restart loses: engines are its children (they die with it), and a new
runner starts them again from the pods.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import logging
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client

from llmfleet.core.kube import api_client
from llmfleet.core.local import engines, kubelet_targets, podnet, processes
from llmfleet.core.local.processes import RESTART_BACKOFF_MAX

log = logging.getLogger("llmfleet.podrunner")

POOL_LABEL = "llmfleet.dev/pool"
SERVICE_LABEL = "llmfleet.dev/service"
CONFIG_HASH = "llmfleet.dev/config-hash"
REVISION_LABEL = "llmfleet.dev/revision"
CONFIG_VOLUME = "runtime-config"
PROBE_TIMEOUT = 1.0
FAILURE_SECONDS = 6.0
"""How long a ready engine's probes must fail before its pod turns not ready (a kubelet's
readiness probe: 3 failures of a probe every 2 s, as the operator's pod template asks)."""


@dataclass(frozen=True)
class PodView:
    """What the runner needs of one engine pod."""

    uid: str
    namespace: str
    name: str
    ip: str
    service: str
    pool: str
    revision: str
    config_map: str
    config_key: str
    container: str
    image: str
    env: dict[str, str]
    ready: bool | None
    """The pod's `Ready` condition (None when it has none)."""


@dataclass
class Engine:
    pod: PodView
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    started_wall: str = ""
    """When the engine last started (RFC 3339), for the container status."""
    restarts: int = 0
    next_start: float = 0.0
    healthy: bool = False
    failing_since: float | None = None
    """When its probes started failing (monotonic), None while they succeed."""
    last_error: str = ""

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


def pod_view(pod: Any) -> PodView | None:
    """The engine pod's view, or None when it has no IP yet, is not running or is going away."""
    meta, spec, status = pod.metadata, pod.spec, pod.status
    labels = meta.labels or {}
    if meta.deletion_timestamp is not None or status is None or status.phase != "Running":
        return None
    if not status.pod_ip or not podnet.in_pod_network(status.pod_ip):
        return None
    container = spec.containers[0]
    config_key = ""
    command = [*(container.command or []), *(container.args or [])]
    if "--config" in command[:-1]:
        config_key = Path(command[command.index("--config") + 1]).name
    config_map = next(
        (v.config_map.name for v in spec.volumes or [] if v.name == CONFIG_VOLUME and v.config_map),
        "",
    )
    env = {item.name: item.value or "" for item in container.env or [] if item.value_from is None}
    ready = next(
        (c.status == "True" for c in status.conditions or [] if c.type == "Ready"),
        None,
    )
    return PodView(
        uid=meta.uid,
        namespace=meta.namespace,
        name=meta.name,
        ip=status.pod_ip,
        service=labels.get(SERVICE_LABEL, ""),
        pool=labels.get(POOL_LABEL, ""),
        revision=labels.get(REVISION_LABEL) or (meta.annotations or {}).get(CONFIG_HASH, ""),
        config_map=config_map,
        config_key=config_key,
        container=container.name,
        image=container.image or "",
        env=env,
        ready=ready,
    )


def _target_labels(pod: Any) -> dict[str, str]:
    """An engine pod's target labels, as the runner gives its own engines'."""
    labels = pod.metadata.labels or {}
    return {
        "namespace": pod.metadata.namespace,
        "pod": pod.metadata.name,
        "llmfleet_dev_service": labels.get(SERVICE_LABEL, ""),
        "llmfleet_dev_pool": labels.get(POOL_LABEL, ""),
        "revision": labels.get(REVISION_LABEL)
        or (pod.metadata.annotations or {}).get(CONFIG_HASH, ""),
    }


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """PR_SET_PDEATHSIG: the engine gets SIGKILL when the runner dies, so none is orphaned."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


class PodRunner:
    def __init__(
        self,
        core: client.CoreV1Api,
        binary: Path,
        log_dir: Path,
        targets_file: Path | None = None,
        *,
        probe: Callable[[str], bool] | None = None,
        stop_grace: float = 5.0,
        component_targets: Path | None = None,
    ) -> None:
        self.core = core
        self.binary = binary
        self.log_dir = log_dir
        self.targets_file = targets_file
        self.stop_grace = stop_grace
        self.engines: dict[str, Engine] = {}
        self._probe = probe or probe_health
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="probe")
        self._targets_written: dict[Path, str] = {}
        self.component_targets = component_targets
        """With a real node: the chart's component pods' targets are written here."""
        self._kubelet_engines: list[dict[str, Any]] = []
        log_dir.mkdir(parents=True, exist_ok=True)

    # -- one pass ------------------------------------------------------------------------------

    def reconcile(self) -> None:
        listing = self.core.list_pod_for_all_namespaces(label_selector=POOL_LABEL)
        wanted = {view.uid: view for pod in listing.items if (view := pod_view(pod)) is not None}
        # Engine pods on the real node run under the kubelet: only their targets are ours.
        self._kubelet_engines = kubelet_targets.engine_groups(listing.items, _target_labels)
        for uid in [uid for uid in self.engines if uid not in wanted]:
            self._stop(self.engines.pop(uid), "its pod is gone")
        now = time.monotonic()
        for uid, view in wanted.items():
            engine = self.engines.get(uid)
            if engine is None:
                engine = self.engines[uid] = Engine(
                    view, self.log_dir / f"{view.namespace}_{view.name}.log"
                )
            engine.pod = view
            if not engine.alive():
                self._exited(engine, now)
                if now >= engine.next_start:
                    self._start(engine)
        health = dict(
            zip(
                self.engines,
                self._pool.map(
                    lambda e: e.alive() and self._probe(e.pod.ip), list(self.engines.values())
                ),
                strict=True,
            )
        )
        for uid, engine in self.engines.items():
            if health[uid]:
                engine.failing_since = None
            elif engine.failing_since is None:
                engine.failing_since = now
            # As a kubelet's readiness probe: one success makes it ready; a ready engine turns
            # not ready once its probes have failed for FAILURE_SECONDS (a slow answer on a busy
            # machine is not an outage), or at once when its process is gone.
            if health[uid]:
                engine.healthy = True
            elif not engine.alive() or now - (engine.failing_since or now) >= FAILURE_SECONDS:
                engine.healthy = False
            if engine.pod.ready != engine.healthy:
                self._set_ready(engine)
        self._write_targets()
        self._write_component_targets()

    def run(self, stop: threading.Event, interval: float = 0.5) -> None:
        """Reconcile every `interval` until `stop` is set; then stop every engine."""
        try:
            while not stop.is_set():
                try:
                    self.reconcile()
                except Exception as error:  # the API server restarting, a network hiccup
                    log.warning("pod runner pass failed: %s", error)
                stop.wait(interval)
        finally:
            self.close()

    def close(self) -> None:
        for engine in self.engines.values():
            self._stop(engine, "the pod runner stops")
        self.engines.clear()
        self._write_targets()
        self._pool.shutdown(wait=False)

    # -- engines -------------------------------------------------------------------------------

    def _config(self, view: PodView) -> Mapping[str, Any]:
        if not view.config_map or not view.config_key:
            raise engines.EngineConfigError("the pod mounts no runtime config")
        config_map = self.core.read_namespaced_config_map(view.config_map, view.namespace)
        text = (config_map.data or {}).get(view.config_key)
        if text is None:
            raise engines.EngineConfigError(
                f"ConfigMap {view.config_map} has no key {view.config_key}"
            )
        loaded: Mapping[str, Any] = json.loads(text)
        return loaded

    def _start(self, engine: Engine) -> None:
        view = engine.pod
        try:
            argv = engines.engine_argv(
                str(self.binary), self._config(view), view.env, seed=engine.restarts
            )
        except (engines.EngineConfigError, ValueError, client.ApiException) as error:
            engine.last_error = str(error)
            engine.next_start = time.monotonic() + RESTART_BACKOFF_MAX
            log.warning("%s/%s: cannot start its engine: %s", view.namespace, view.name, error)
            return
        out = engine.log_path.open("ab")
        try:
            engine.process = subprocess.Popen(
                ["unshare", "--net", "--", *argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "POD_IP": view.ip},
                preexec_fn=_die_with_parent,  # noqa: PLW1509 - only prctl, async-signal-safe
            )
        finally:
            out.close()
        engine.started_wall = _now()
        try:
            podnet.attach(engine.process.pid, view.ip)
        except podnet.PodNetError as error:
            engine.last_error = str(error)
            log.warning("%s/%s: %s", view.namespace, view.name, error)
            self._kill(engine)
            engine.next_start = time.monotonic() + RESTART_BACKOFF_MAX
            return
        log.info(
            "%s/%s: engine started on %s:%s (pid %d%s)",
            view.namespace, view.name, view.ip, engines.ENGINE_PORT, engine.process.pid,
            f", restart {engine.restarts}" if engine.restarts else "",
        )  # fmt: skip

    def _exited(self, engine: Engine, now: float) -> None:
        """Note an engine that was running and has exited; schedule its restart."""
        if engine.process is None:
            return
        code = engine.process.returncode
        view = engine.pod
        engine.process = None
        engine.restarts += 1
        backoff = processes.restart_backoff(engine.restarts)
        engine.next_start = now + backoff
        engine.last_error = f"engine exited with {code}"
        podnet.detach(view.ip)
        log.warning(
            "%s/%s: engine exited with %s; restarting in %.0fs (restart %d)",
            view.namespace, view.name, code, backoff, engine.restarts,
        )  # fmt: skip

    def _kill(self, engine: Engine) -> None:
        processes.stop(engine.process, self.stop_grace)
        engine.process = None
        podnet.detach(engine.pod.ip)

    def _stop(self, engine: Engine, why: str) -> None:
        if engine.process is not None:
            log.info("%s/%s: stopping its engine (%s)", engine.pod.namespace, engine.pod.name, why)
        self._kill(engine)

    # -- readiness and discovery ---------------------------------------------------------------

    def _set_ready(self, engine: Engine) -> None:
        view = engine.pod
        status = "True" if engine.healthy else "False"
        if engine.healthy:
            reason, message = "EngineReady", "the engine answers /health/ready"
        elif engine.alive():
            reason, message = "EngineNotReady", "the engine is starting or not answering"
        else:
            reason, message = "EngineNotRunning", engine.last_error or "the engine is not running"
        now = _now()
        condition = {"status": status, "reason": reason, "message": message}
        conditions = [
            {"type": kind, "lastTransitionTime": now, **condition}
            for kind in ("Ready", "ContainersReady")
        ]
        # Strategic merge merges conditions by type but replaces containerStatuses whole, so the
        # container's status is written complete (kubectl's READY and RESTARTS columns read it).
        if engine.alive():
            state = {"running": {"startedAt": engine.started_wall or now}}
        else:
            state = {"waiting": {"reason": "EngineRestarting", "message": engine.last_error}}
        container = {
            "name": view.container,
            "image": view.image,
            "imageID": "",
            "ready": engine.healthy,
            "started": engine.alive(),
            "restartCount": engine.restarts,
            "state": state,
        }
        try:
            self.core.patch_namespaced_pod_status(
                view.name,
                view.namespace,
                {"status": {"conditions": conditions, "containerStatuses": [container]}},
            )
        except client.ApiException as error:
            if error.status != 404:  # a pod deleted meanwhile needs nothing
                log.warning(
                    "%s/%s: cannot set Ready=%s: %s",
                    view.namespace,
                    view.name,
                    status,
                    error.reason,
                )
            return
        log.info("%s/%s: Ready=%s (%s)", view.namespace, view.name, status, reason)

    def targets(self) -> list[dict[str, Any]]:
        """Prometheus file-discovery groups, one per running engine."""
        groups = []
        for engine in sorted(self.engines.values(), key=lambda e: (e.pod.namespace, e.pod.name)):
            if not engine.alive():
                continue
            view = engine.pod
            labels = {
                "namespace": view.namespace,
                "pod": view.name,
                "llmfleet_dev_service": view.service,
                "llmfleet_dev_pool": view.pool,
                "revision": view.revision,
            }  # as `_target_labels` for a pod the kubelet runs
            groups.append({"targets": [f"{view.ip}:{engines.ENGINE_PORT}"], "labels": labels})
        return groups + self._kubelet_engines

    def _write_targets(self) -> None:
        if self.targets_file is not None:
            self._write(self.targets_file, self.targets())

    def _write_component_targets(self) -> None:
        if self.component_targets is not None:
            pods = self.core.list_pod_for_all_namespaces(
                label_selector=kubelet_targets.COMPONENT_LABEL
            )
            self._write(self.component_targets, kubelet_targets.component_groups(pods.items))

    def _write(self, path: Path, groups: list[dict[str, Any]]) -> None:
        text = json.dumps(groups, indent=1)
        if text == self._targets_written.get(path):
            return
        partial = path.with_suffix(".tmp")
        partial.write_text(text)
        partial.replace(path)  # atomic: Prometheus never reads half a file
        self._targets_written[path] = text


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
"""No proxy from the environment: a probe goes to the address itself, as the kubelet's does."""


def http_ok(url: str, timeout: float = PROBE_TIMEOUT) -> bool:
    """GET `url` answers 200 within `timeout` (the supervisor's readiness checks use it too)."""
    try:
        with contextlib.closing(_OPENER.open(url, timeout=timeout)) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def probe_health(ip: str) -> bool:
    """The engine's /health/ready answers 200 (the simulator says 503 while it "loads the
    model")."""
    return http_ok(f"http://{ip}:{engines.ENGINE_PORT}/health/ready")


def main() -> None:
    parser = argparse.ArgumentParser(description="Engines behind the local cluster's pods.")
    parser.add_argument("--binary", required=True, type=Path, help="llm-d-inference-sim")
    parser.add_argument("--logs", required=True, type=Path, help="one log file per engine here")
    parser.add_argument("--targets", type=Path, help="Prometheus file-discovery JSON to write")
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument(
        "--component-targets", type=Path,
        help="Prometheus file-discovery JSON of the component pods the real node runs",
    )  # fmt: skip
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    core = client.CoreV1Api(api_client())
    runner = PodRunner(
        core, args.binary, args.logs, args.targets, component_targets=args.component_targets,
    )  # fmt: skip
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    runner.run(stop, args.interval)


if __name__ == "__main__":
    main()
