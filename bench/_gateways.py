"""Gateway replicas and change latency for bench/control_plane_scale.py (issue 28).

`Replica` is one `llmfleet gateway` process discovering the benchmark's namespace from the API
server, read through its own /metrics (the families asked for: `?name[]=`):
`llmfleet_gateway_discovered_endpoints` says what it routes to now,
`llmfleet_gateway_event_loop_lag_max_seconds` how late its loop ran.

`change_latencies` changes one service's replicas at a time (up one, then back) and times, from
the patch, when each link of the chain has acted: the operator (up: the pool's Deployment has
the new replicas; down: the operator demotes a pod at once and shrinks the Deployment only after
the drain, so the demotion is what the EndpointSlices show), Kubernetes (the pool Service's
EndpointSlices have the new count of ready endpoints) and every gateway replica (its discovered
endpoints have the new total). The two API reads are polled every `POLL_SECONDS`, so each figure
is late by up to that much; the gateway's own delay is its time after the EndpointSlices'.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from _support import free_port, revision_env

from llmfleet.core import loopback
from llmfleet.core.cluster import local
from llmfleet.core.kube import api_client

POLL_SECONDS = 0.02
SERVICES = "llmfleet_gateway_discovered_services"
ENDPOINTS = "llmfleet_gateway_discovered_endpoints"
CHANGE_TIMEOUT_SECONDS = 120.0


def cpu_seconds(process: psutil.Process) -> float:
    """User plus system CPU seconds the process has used."""
    return float(sum(process.cpu_times()[:2]))


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 30 s; returns once it has exited."""
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident memory (VmHWM) in MiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmHWM:")[1].split()[0]) / 1024


class Replica:
    """`llmfleet gateway` on a free 127.0.0.1 port, discovering `namespace`; with `source`
    (a commit's source roots, `control_plane_scale.checkout`) that commit's gateway."""

    def __init__(self, kubeconfig: Path, namespace: str, log: Path,
                 source: Path | None = None, stalls: Path | None = None) -> None:  # fmt: skip
        self.port = free_port()
        self.log = log
        self.stalls = stalls
        run = [sys.executable, "-m", "llmfleet.core.cli"]
        if stalls is not None:  # run through the stall probe, writing to `stalls`
            run = [sys.executable, str(Path(__file__).with_name("_stall_probe.py")), str(stalls),
                   "--"]  # fmt: skip
        command = [*run, "gateway", "--kubeconfig", str(kubeconfig), "--namespace", namespace,
                   "--port", str(self.port)]  # fmt: skip
        # The pod network is allowed: it exists only in the run's namespace (_fleet_load.py).
        env = {**os.environ, "LLMFLEET_LOOPBACK_ONLY": "true",
               loopback.NETWORKS_ENV: local.POD_NETWORK}  # fmt: skip
        env = revision_env(source, env)
        self.started = time.monotonic()
        with log.open("w") as out:
            self.process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        self._ps = psutil.Process(self.process.pid)

    def metrics(self, *names: str) -> str:
        """Its /metrics text, with `names` only those families (a gateway before `name[]` was
        honoured answers all of them); "" while it does not answer."""
        query = urllib.parse.urlencode([("name[]", name) for name in names])
        url = f"http://127.0.0.1:{self.port}/metrics" + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return str(response.read().decode())
        except (urllib.error.URLError, OSError):
            return ""

    def ready(self) -> bool:
        """Whether its /readyz answers 200 (discovered, and its routing state made)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=5) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def value(self, name: str, text: str | None = None) -> float | None:
        """The sample `name` (with its labels, as exposed) of /metrics; None when absent."""
        return sample(self.metrics() if text is None else text, name)

    def endpoints(self) -> float | None:
        """What it routes to: one family read, whatever the size of its /metrics (at 1,000
        pools with traffic a whole read is a ~2 s paced render, which a change's poll waited)."""
        text = self.metrics(ENDPOINTS)
        return self.value(ENDPOINTS + '{role="unified"}', text)

    def cpu_seconds(self) -> float:
        return cpu_seconds(self._ps)

    def peak_rss_mib(self) -> float:
        return peak_rss_mib(self.process.pid)

    def stop(self) -> None:
        stop_process(self.process)


def wait_discovered(replicas: list[Replica], services: int, endpoints: int) -> list[float]:
    """Seconds from each replica's start until it routes to every service and endpoint."""
    taken: list[float | None] = [None] * len(replicas)
    deadline = time.monotonic() + 600
    while None in taken:
        if time.monotonic() > deadline:
            raise SystemExit(f"gateways did not discover {services} services in 600 s")
        for index, replica in enumerate(replicas):
            if taken[index] is not None:
                continue
            if replica.process.poll() is not None:
                raise SystemExit(f"a gateway exited ({replica.log}):\n{replica.log.read_text()}")
            text = replica.metrics(SERVICES, ENDPOINTS)
            found = replica.value(SERVICES, text)
            routed = replica.value(ENDPOINTS + '{role="unified"}', text)
            if found == services and routed == endpoints:
                taken[index] = time.monotonic() - replica.started
        time.sleep(0.1)
    return [t for t in taken if t is not None]


@dataclass
class Latencies:
    """Seconds from each patch until each link acted (one entry per change)."""

    operator: list[float] = field(default_factory=list)
    """Up changes only: until the Deployment has the new replicas."""
    slices: list[float] = field(default_factory=list)
    gateways: list[float] = field(default_factory=list)
    """The slowest replica's, per change."""
    after_slices: list[float] = field(default_factory=list)
    """The slowest replica's time after the EndpointSlices had it."""


def _ready_endpoints(slices: object) -> int:
    return sum(
        1
        for item in getattr(slices, "items", None) or []
        for endpoint in item.endpoints or []
        if endpoint.conditions is not None and endpoint.conditions.ready
    )


def change_latencies(
    kubeconfig: Path,
    namespace: str,
    replicas: list[Replica],
    *,
    services: int,
    pods_per_service: int,
    changes: int,
) -> Latencies:
    """`changes` replica changes, one at a time: odd ones add a pod to a service, even ones
    take it back; each waits until every link has acted."""
    from kubernetes import client  # noqa: PLC0415 - the benchmark's only client use

    api = api_client(str(kubeconfig))
    apps, discovery = client.AppsV1Api(api), client.DiscoveryV1Api(api)
    custom = client.CustomObjectsApi(api)
    total = services * pods_per_service
    found = Latencies()
    for change in range(changes):
        name = f"svc-{(change // 2) % services:04d}"
        up = change % 2 == 0
        target = pods_per_service + (1 if up else 0)
        expected = total + (1 if up else 0)
        pool = f"{name}-unified"
        started = time.monotonic()
        custom.patch_namespaced_custom_object(
            "llmfleet.dev", "v1alpha1", namespace, "inferenceservices", name,
            {"spec": {"topology": {"unified": {"replicas": target}}}},
        )  # fmt: skip
        operator = None if up else 0.0
        slices = None
        gateways: list[float | None] = [None] * len(replicas)
        while operator is None or slices is None or None in gateways:
            now = time.monotonic() - started
            if now > CHANGE_TIMEOUT_SECONDS:
                raise SystemExit(f"change {change} ({name} to {target}) not done in "
                                 f"{CHANGE_TIMEOUT_SECONDS:.0f}s: operator {operator}, "
                                 f"slices {slices}, gateways {gateways}")  # fmt: skip
            if operator is None:
                spec = apps.read_namespaced_deployment(pool, namespace).spec
                operator = now if spec.replicas == target else None
            if slices is None:
                listed = discovery.list_namespaced_endpoint_slice(
                    namespace, label_selector=f"kubernetes.io/service-name={pool}"
                )
                slices = now if _ready_endpoints(listed) == target else None
            for index, replica in enumerate(replicas):
                if gateways[index] is None and replica.endpoints() == expected:
                    gateways[index] = now
            time.sleep(POLL_SECONDS)
        slowest = max(g for g in gateways if g is not None)
        if up:
            found.operator.append(operator)
        found.slices.append(slices)
        found.gateways.append(slowest)
        found.after_slices.append(max(0.0, slowest - slices))
    return found


def p50_p99_ms(values: list[float]) -> str:
    """ "p50 / p99" in milliseconds (p99 is the largest below 100 values)."""
    if not values:
        return "-"
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return f"{statistics.median(ordered) * 1000:.0f} / {p99 * 1000:.0f}"


LAG = "llmfleet_gateway_event_loop_lag_seconds"
GC_PAUSE = "llmfleet_gateway_gc_pause_seconds"


def lag_buckets(replica: Replica, text: str | None = None) -> dict[float, float]:
    """The loop-lag histogram's cumulative buckets now (upper bound -> samples)."""
    return buckets(replica, f"{LAG}_bucket{{", text)


OWN_LAG = "llmfleet_gateway_event_loop_own_lag_seconds"
CPU_WAIT = "llmfleet_gateway_event_loop_cpu_wait_seconds_total"


def own_lag_buckets(replica: Replica, text: str | None = None) -> dict[float, float]:
    """The own loop-lag histogram's (each sample less the loop thread's wait for a CPU), as
    `lag_buckets`; empty for a gateway without it."""
    return buckets(replica, f"{OWN_LAG}_bucket{{", text)


def sample(text: str, name: str) -> float | None:
    """The sample `name` (with its labels, as exposed) of a /metrics `text`; None when absent."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def cpu_wait_ms(before: str, after: str) -> str:
    """How long the loop's thread waited for a CPU between two /metrics texts [ms] ("-": a
    gateway without the counter)."""
    first, last = sample(before, CPU_WAIT), sample(after, CPU_WAIT)
    return "-" if first is None or last is None else f"{(last - first) * 1000:.0f}"


def gc_buckets(replica: Replica, text: str | None = None) -> dict[float, float]:
    """The full (generation 2) garbage collections' pause histogram, as `lag_buckets`."""
    return buckets(replica, f'{GC_PAUSE}_bucket{{generation="2",', text)


GC_PAUSE_CPU = "llmfleet_gateway_gc_pause_cpu_seconds"


def gc_cpu_buckets(replica: Replica, text: str | None = None) -> dict[float, float]:
    """The full collections' CPU-time histogram, as `gc_buckets`; empty for a gateway
    without it."""
    return buckets(replica, f'{GC_PAUSE_CPU}_bucket{{generation="2",', text)


def buckets(replica: Replica, prefix: str, text: str | None = None) -> dict[float, float]:
    """A histogram's cumulative buckets (upper bound -> samples) from the /metrics lines that
    start with `prefix` (its name, `_bucket{` and any labels before `le`)."""
    found: dict[float, float] = {}
    for line in (replica.metrics() if text is None else text).splitlines():
        if line.startswith(prefix + 'le="'):
            bound = line.split('le="')[1].split('"')[0]
            found[float("inf") if bound == "+Inf" else float(bound)] = float(line.split()[-1])
    return found


def lag_largest(before: dict[float, float], after: dict[float, float]) -> str:
    """The smallest bucket bound [ms] that holds every sample between the two reads ("-":
    none)."""
    total = after.get(float("inf"), 0.0) - before.get(float("inf"), 0.0)
    if total <= 0:
        return "-"  # nothing sampled between the reads (no full collection ran, say)
    for bound in sorted(after):
        if after[bound] - before.get(bound, 0.0) >= total:
            return "inf" if bound == float("inf") else f"{bound * 1000:g}"
    return "-"
