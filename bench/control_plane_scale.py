"""Benchmark (first version, issue 28): what an idle fleet costs the API server.

Applies `--services` InferenceServices of `--pods-per-service` replicas on the local cluster,
waits until all are Ready, then counts the API server's requests over an idle window (its own
`apiserver_request_total`, by verb and resource; and its audit log, by component from each
request's User-Agent, verb and resource: `_audit.py`) and reports them per second, beside:
- the same number of plain Deployments (same pods) with no operator, in the same run: what the
  control plane itself (controllers, kwok) costs while idle;
- with `--baseline COMMIT`, the operator of that commit (run from `git archive` of it, on this
  checkout's environment) on the same services, in the same run and cluster, and with it that
  commit's `--gateways` replicas over the idle window (their CPU and RSS; the by-verb and
  by-component tables count their requests).

    llmfleet isolated -- python bench/control_plane_scale.py --services 20 --pods-per-service 2 \\
        [--baseline main] [--idle-seconds 60] [--resync-seconds 10] [--gateways 2] \\
        [--changes 50] [--no-autoscaler] [--load-rate 600] [--load-seconds 30] \\
        [--kubeconfig FILE] [--no-plain] [--stall-probe DIR]

With this checkout's operator, `--gateways` gateway replicas (2 by default) discover the
services too (`_gateways.py`), and the run reports: the time until each routes to every
endpoint, their CPU over the idle window, peak RSS and largest event-loop lag; then `--changes`
replica changes, one at a time, timed from the patch to the operator's Deployment, to the
EndpointSlices and to every gateway; then a gateway restarted, timed until it routes to all,
with its loop lag before and after its /readyz says ready. Each operator (the baseline's too)
is restarted with a change made at its start, timed until it acts on it, with the steps of its
start (`llmfleet_operator_start_seconds`: serving, listed, first pass); its reconcile p50/p99,
CPU and peak RSS are read too.

Then, unless `--no-autoscaler`, autoscaling is turned on for every service (bounded to its
pods, so the pod counts stay) and `llmfleet autoscaler` runs against a Prometheus that scrapes
one stand-in exporter serving every pod's vLLM-style series (`_autoscaler.py`,
`_fleet_metrics.py`) and evaluating the chart's rules, recording rules included, as the chart
installs them: its full and fast pass p50/p99/max, what the full passes read (the recorded
series or the raw ones), Prometheus queries per pass and Prometheus's own CPU (rule evaluations
included), errors, CPU and peak RSS over the idle window (at least 60 s), and after a restart
the time until its first pass is done.

With `--load-rate` (600 req/s by default), after the changes an open loop of that many
requests a second for `--load-seconds` goes through the gateway replicas of the whole fleet, and
the same through replicas of a fleet of 10 services beside it (`_fleet_load.py`: one stand-in
engine answers for every pod IP, inside the run's own network namespace): latency p50/p99,
event-loop lag, CPU and engine scrapes of each.

`--stall-probe DIR` runs the first fleet's gateway replicas through `_stall_probe.py` (its
records in DIR/stalls-N.jsonl) and prints, for the changes and the load, the event-loop stalls
of at least 5 ms it saw with what held them (the probe costs CPU: a diagnosis, not figures to
quote). `--no-plain` leaves out the plain
Deployments (no idle column for them: a quicker run for such a diagnosis).

`apiserver_request_total` has no user agent, so its table is the whole API server's; the
by-component table splits it (a cluster given with `--kubeconfig` has no audit log we can
read: that table is left out). The idle window should span several of the operator's resync
periods (`--resync-seconds`, 30 s by default in production).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

import _audit
import _stall_probe
import psutil
import yaml
from _autoscaler import figures as autoscaler_figures
from _fleet_load import Engine, answer_pod_ips, under_load
from _gateways import (
    Replica,
    change_latencies,
    cpu_seconds,
    cpu_wait_ms,
    lag_buckets,
    lag_largest,
    own_lag_buckets,
    p50_p99_ms,
    peak_rss_mib,
    wait_discovered,
)
from _support import SOURCE_ROOTS, checkout, free_port
from operator_scale import count_ready_services, histogram_quantile, kubectl

from llmfleet.core import netns
from llmfleet.core.cluster import LocalCluster
from llmfleet.crds import render

WRITES = frozenset({"POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"})
_SAMPLE = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

Counts = Counter[tuple[str, str]]
SMALL_NAMESPACE = "bench-small"
MODEL, SMALL_MODEL = "org/model", "org/small-model"
"""The model names' stems of the fleet and of the 10 services beside it: distinct, as one
operator watches both namespaces and a name claimed twice is a conflict (ModelNameConflict)."""
SMALL_SERVICES = 10
"""The fleet the gateways' latency under load is compared with (the issue's "at 10 services")."""
BASELINE_SETTLE_SECONDS = 20.0
"""How long the baseline's gateways get to discover the fleet before the idle window."""
IDLE_WINDOWS: list[tuple[float, float]] = []
"""Each `idle_rates` window in wall-clock time, in the order of the report's columns."""
STALLS: list[str] = []
"""With `--stall-probe`: lines on the stalls its replicas saw, printed after the report."""


def requests(kubeconfig: Path) -> Counts:
    """(verb, resource[/subresource]) -> requests the API server has served so far."""
    counts: Counts = Counter()
    for line in kubectl(kubeconfig, "get", "--raw", "/metrics").splitlines():
        found = _SAMPLE.match(line)
        if found is None:
            continue
        labels = dict(_LABEL.findall(found["labels"]))
        resource = labels.get("resource", "")
        if labels.get("subresource"):
            resource += f"/{labels['subresource']}"
        counts[(labels.get("verb", ""), resource)] += int(float(found["value"]))
    return counts


def idle_rates(kubeconfig: Path, seconds: float) -> dict[tuple[str, str], float]:
    """Requests per second by (verb, resource) over `seconds` of nothing being changed."""
    before, started, wall = requests(kubeconfig), time.monotonic(), time.time()
    time.sleep(seconds)
    after, elapsed = requests(kubeconfig), time.monotonic() - started
    IDLE_WINDOWS.append((wall, wall + elapsed))
    # The benchmark's own reads of /metrics are not the fleet's.
    return {
        key: (after[key] - before[key]) / elapsed
        for key in after
        if after[key] != before[key] and key[1] != ""
    }


def services(count: int, replicas: int, model: str = MODEL) -> str:
    """`count` services `svc-0000`... serving `{model}-0`... (a model name of their own each)."""
    return yaml.safe_dump_all(
        {
            "apiVersion": "llmfleet.dev/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": f"svc-{i:04d}"},
            "spec": {
                "model": {"name": f"{model}-{i}"},
                "topology": {"unified": {"replicas": replicas}},
            },
        }
        for i in range(count)
    )


def deployments(count: int, replicas: int) -> str:
    def one(i: int) -> dict[str, object]:
        app = {"app": f"dep-{i:04d}"}
        container = {"name": "engine", "image": "fake",
                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}  # fmt: skip
        return {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": f"dep-{i:04d}"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": app},
                     "template": {"metadata": {"labels": app},
                                  "spec": {"containers": [container]}}},
        }  # fmt: skip

    return yaml.safe_dump_all(one(i) for i in range(count))


def ready_pods(kubeconfig: Path, namespace: str) -> int:
    """Ready pods of the namespace's Deployments, from their status (a LIST of 1,000
    Deployments, not of 10,000 pods: the latter took a core for 4 s every poll)."""
    out = kubectl(kubeconfig, "get", "deployments", "-n", namespace, "-o",
                  "jsonpath={.items[*].status.readyReplicas}")  # fmt: skip
    return sum(int(value) for value in out.split())


def poll_seconds(count: int) -> float:
    """How often to poll a fleet of `count` services for Ready: 2 s, 5 s at 1,000 (a poll is a
    LIST of all of them, and the benchmark's own polls must not load the API server much)."""
    return max(2.0, count / 200)


def wait(what: str, done: object, timeout: float = 1800, every: float = 2) -> float:
    """Seconds until `done()` is true (checked every `every` s)."""
    started = time.monotonic()
    while not done():  # type: ignore[operator]
        if time.monotonic() - started > timeout:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(every)
    return time.monotonic() - started


class Operator:
    """An operator process (this checkout's, or `source`'s) with its metrics on `port`."""

    def __init__(self, kubeconfig: Path, namespaces: list[str], log: Path, resync: float,
                 source: Path | None) -> None:  # fmt: skip
        self.port = free_port()
        self.started = time.monotonic()
        self.process = run_operator(kubeconfig, namespaces, log, resync=resync, source=source,
                                    port=self.port)  # fmt: skip
        self._ps = psutil.Process(self.process.pid)

    def cpu_seconds(self) -> float:
        return cpu_seconds(self._ps)

    def peak_rss_mib(self) -> float:
        return peak_rss_mib(self.process.pid)

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.read().decode()

    def start_steps(self) -> str:
        """Seconds from its process's start to serving / listed / first pass
        (`llmfleet_operator_start_seconds`; "-" for a step it has not reached or does not
        report: a baseline's operator may predate the gauge)."""
        found = dict(re.findall(r'^llmfleet_operator_start_seconds\{step="(\w+)"\} (\S+)$',
                                self.metrics(), re.MULTILINE))  # fmt: skip
        return " / ".join(f"{float(found[step]):.1f}" if step in found else "-"
                          for step in ("serving", "listed", "first_pass"))  # fmt: skip

    def reconcile_ms(self) -> str:
        """Its reconcile p50 / p99 [ms] so far (its own histogram)."""
        text = self.metrics()
        name = "llmfleet_operator_reconcile_seconds"
        p50, p99 = (histogram_quantile(text, name, q) * 1000 for q in (0.5, 0.99))
        return f"{p50:.0f} / {p99:.0f}"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)


def run_operator(kubeconfig: Path, namespaces: list[str], log: Path, *, resync: float,
                 source: Path | None, port: int) -> subprocess.Popen[bytes]:  # fmt: skip
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "LLMFLEET_OPERATOR_METRICS_PORT": str(port),
        "LLMFLEET_OPERATOR_METRICS_HOST": "127.0.0.1",
        "LLMFLEET_OPERATOR_PROBE_IN_FLIGHT": "false",
        "LLMFLEET_OPERATOR_RESYNC_SECONDS": str(resync),
        "LLMFLEET_LOOPBACK_ONLY": "true",
    }
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join(str(source / root) for root in SOURCE_ROOTS)
    return subprocess.Popen(
        [sys.executable, "-m", "llmfleet.core.cli", "operator", "--standalone",
         *(f"--namespace={namespace}" for namespace in namespaces)],
        env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
    )  # fmt: skip


Rows = dict[str, dict[str, str]]
"""Figure -> column -> value, printed under the request table."""


def run(kubeconfig: Path, args: argparse.Namespace, workdir: Path) -> None:
    count, replicas, idle = args.services, args.pods_per_service, args.idle_seconds
    columns: dict[str, dict[tuple[str, str], float]] = {}
    ready: dict[str, float] = {}
    rows: Rows = {}

    if args.plain:
        ready["plain Deployments"], columns["plain Deployments"] = plain(kubeconfig, args)

    for manifest in sorted(render.MANIFESTS_DIR.glob("*.yaml")):
        kubectl(kubeconfig, "apply", "--server-side", "-f", str(manifest))
    variants: list[tuple[str, Path | None]] = []
    if args.baseline:
        variants.append((f"operator @{args.baseline}", checkout(args.baseline, workdir / "base")))
    variants.append(("operator (this checkout)", None))
    for index, (label, source) in enumerate(variants):
        namespace = f"bench-op-{index}"
        kubectl(kubeconfig, "create", "namespace", namespace)
        loaded = source is None and args.gateways and args.load_rate > 0
        namespaces = [namespace, SMALL_NAMESPACE] if loaded else [namespace]
        operator = Operator(kubeconfig, namespaces, workdir / f"operator-{index}.log",
                            args.resync_seconds, source)  # fmt: skip
        try:
            time.sleep(3)
            cpu = operator.cpu_seconds()
            print(f"{label}: applying {count} services ...", flush=True)
            applied = apply_services(kubeconfig, namespace, count, replicas)
            figure(rows, "services applied (kubectl, 100 a call) [s]", label, f"{applied:.1f}")
            ready[label] = applied + wait(
                label,
                lambda ns=namespace: count_ready_services(kubeconfig, ns) >= count,
                every=poll_seconds(count),
            )
            figure(rows, "operator CPU until all Ready [s]", label,
                   f"{operator.cpu_seconds() - cpu:.1f}")  # fmt: skip
            figure(rows, "operator reconcile p50 / p99 [ms]", label, operator.reconcile_ms())
            if loaded:  # the fleet of 10 the gateways' latency is compared with
                kubectl(kubeconfig, "create", "namespace", SMALL_NAMESPACE)
                kubectl(kubeconfig, "apply", "--server-side", "-n", SMALL_NAMESPACE, "-f", "-",
                        stdin=services(SMALL_SERVICES, replicas, SMALL_MODEL))  # fmt: skip
                wait("the 10 services", lambda: count_ready_services(
                    kubeconfig, SMALL_NAMESPACE) >= SMALL_SERVICES)  # fmt: skip
            time.sleep(5)
            cpu = operator.cpu_seconds()
            if source is None and args.gateways:
                columns[label] = with_gateways(kubeconfig, namespace, args, workdir=workdir,
                                               rows=rows, label=label)  # fmt: skip
            elif args.gateways:
                columns[label] = idle_gateways(kubeconfig, namespace, args, source,
                                               workdir=workdir, rows=rows, label=label)  # fmt: skip
            else:
                columns[label] = idle_rates(kubeconfig, idle)
            figure(rows, "operator CPU over the idle window [s]", label,
                   f"{operator.cpu_seconds() - cpu:.1f}")  # fmt: skip
            figure(rows, "operator peak RSS [MiB]", label, f"{operator.peak_rss_mib():.0f}")
            operator = restarted(kubeconfig, namespace, operator, source, args=args,
                                 workdir=workdir, rows=rows, label=label)  # fmt: skip
            if source is None and args.autoscaler:
                found = autoscaler_figures(kubeconfig, namespace, args, workdir / "autoscaler")
                for name, value in found:
                    figure(rows, name, label, value)
        finally:
            operator.stop()
        kubectl(kubeconfig, "delete", "namespace", namespace, "--timeout=600s")
    report(args, columns, ready, rows)


def plain(kubeconfig: Path, args: argparse.Namespace) -> tuple[float, dict[tuple[str, str], float]]:
    """The plain Deployments: seconds from their apply until their pods are Ready, and the idle
    request rates."""
    count, replicas = args.services, args.pods_per_service
    print(f"plain Deployments: {count} x {replicas} pods ...", flush=True)
    kubectl(kubeconfig, "create", "namespace", "bench-plain")
    started = time.monotonic()
    kubectl(kubeconfig, "apply", "-n", "bench-plain", "-f", "-", stdin=deployments(count, replicas))
    applied = time.monotonic() - started
    ready = applied + wait(
        "the plain Deployments",
        lambda: ready_pods(kubeconfig, "bench-plain") >= count * replicas,
        every=poll_seconds(count),
    )
    time.sleep(5)
    rates = idle_rates(kubeconfig, args.idle_seconds)
    kubectl(kubeconfig, "delete", "namespace", "bench-plain", "--timeout=600s")
    return ready, rates


def apply_services(kubeconfig: Path, namespace: str, count: int, replicas: int,
                   chunk: int = 100) -> float:  # fmt: skip
    """Apply the `count` services `chunk` at a time (one kubectl call of 1,000 ran past its
    10 minutes while the operator was making their pods); the seconds it took."""
    started = time.monotonic()
    documents = services(count, replicas).split("\n---\n")
    for first in range(0, count, chunk):
        kubectl(kubeconfig, "apply", "--server-side", "-n", namespace, "-f", "-",
                stdin="\n---\n".join(documents[first:first + chunk]))  # fmt: skip
        print(f"  {min(first + chunk, count)}/{count} applied in "
              f"{time.monotonic() - started:.0f} s", flush=True)  # fmt: skip
    return time.monotonic() - started


def figure(rows: Rows, name: str, column: str, value: str) -> None:
    rows.setdefault(name, {})[column] = value


def with_gateways(kubeconfig: Path, namespace: str, args: argparse.Namespace, *, workdir: Path,
                  rows: Rows, label: str) -> dict[tuple[str, str], float]:  # fmt: skip
    """Start the gateway replicas; their discovery, the idle window's request rates (returned),
    the changes, and a replica restarted."""
    total = args.services * args.pods_per_service
    replicas = [Replica(kubeconfig, namespace, workdir / f"gateway-{i}.log",
                        stalls=args.stall_probe / f"stalls-{i}.jsonl" if args.stall_probe else None)
                for i in range(args.gateways)]  # fmt: skip
    each = " / ".join
    try:
        first = wait_discovered(replicas, args.services, total)
        figure(rows, "gateways: started until routing to all [s]", label,
               each(f"{t:.1f}" for t in first))  # fmt: skip
        time.sleep(5)
        rates = idle_window(kubeconfig, replicas, args, rows=rows, label=label)
        if args.changes:
            print(f"{args.changes} replica changes, one at a time ...", flush=True)
            since = time.time()
            texts = [r.metrics() for r in replicas]
            before = [lag_buckets(r, t) for r, t in zip(replicas, texts, strict=True)]
            own_before = [own_lag_buckets(r, t) for r, t in zip(replicas, texts, strict=True)]
            found = change_latencies(kubeconfig, namespace, replicas, services=args.services,
                                     pods_per_service=args.pods_per_service,
                                     changes=args.changes)  # fmt: skip
            links = (("operator's Deployment (ups)", found.operator),
                     ("EndpointSlices", found.slices), ("every gateway routes it", found.gateways),
                     ("gateway after the EndpointSlices", found.after_slices))  # fmt: skip
            for name, values in links:
                figure(rows, f"change -> {name}: p50 / p99 [ms]", label, p50_p99_ms(values))
            after = [r.metrics() for r in replicas]
            during = [lag_largest(before[i], lag_buckets(r, after[i]))
                      for i, r in enumerate(replicas)]  # fmt: skip
            figure(rows, "gateways: event-loop lag during the changes, max <= [ms]", label,
                   each(during))  # fmt: skip
            own = [lag_largest(own_before[i], own_lag_buckets(r, after[i]))
                   for i, r in enumerate(replicas)]  # fmt: skip
            figure(rows, "gateways: the same less CPU wait (own lag), max <= [ms]", label,
                   each(own))  # fmt: skip
            figure(
                rows,
                "gateways: loop thread waited for a CPU meanwhile [ms]",
                label,
                each(cpu_wait_ms(texts[i], after[i]) for i in range(len(replicas))),
            )
            stalls(replicas, "the changes", since, time.time())
        # After the changes: the load gives every service its own series, and the changes'
        # polls read each gateway's /metrics, megabytes once they exist.
        if args.load_rate > 0:
            since = time.time()
            try:
                loaded(kubeconfig, replicas, args, workdir=workdir, rows=rows, label=label)
            except (Exception, SystemExit) as error:  # the other figures still get reported
                figure(rows, "under load: failed", label, repr(error)[:200])
            stalls(replicas, "the load (both fleets' windows)", since, time.time())
        replicas[0].stop()
        replicas[0] = Replica(kubeconfig, namespace, workdir / "gateway-0-restarted.log")
        # An odd number of changes leaves the last one's pod added (`change_latencies`).
        (again,) = wait_discovered(replicas[:1], args.services, total + args.changes % 2)
        figure(rows, "gateway restarted: until routing to all [s]", label, f"{again:.1f}")
        restarted_lag(replicas[0], rows=rows, label=label)
        lag = [(r.value("llmfleet_gateway_event_loop_lag_max_seconds") or 0.0) * 1000
               for r in replicas]  # fmt: skip
        figure(rows, "gateways: largest event-loop lag [ms] (1st restarted)", label,
               each(f"{value:.1f}" for value in lag))  # fmt: skip
        figure(rows, "gateways: peak RSS [MiB] (1st restarted)", label,
               each(f"{r.peak_rss_mib():.0f}" for r in replicas))  # fmt: skip
        return rates
    finally:
        for replica in replicas:
            replica.stop()


def stalls(replicas: list[Replica], phase: str, since: float, until: float) -> None:
    """Keep the probed replicas' stalls in [since, until] for the report (`--stall-probe`)."""
    for index, replica in enumerate(replicas):
        if replica.stalls is not None:
            STALLS.append(
                f"gateway {index}, during {phase}: "
                + "\n".join(
                    _stall_probe.summary(_stall_probe.read(str(replica.stalls)), since, until)
                )
            )


def idle_window(kubeconfig: Path, replicas: list[Replica], args: argparse.Namespace, *,
                rows: Rows, label: str) -> dict[tuple[str, str], float]:  # fmt: skip
    """The idle window's request rates (returned), and the gateway replicas' CPU over it and
    peak RSS after it."""
    each = " / ".join
    cpu = [replica.cpu_seconds() for replica in replicas]
    rates = idle_rates(kubeconfig, args.idle_seconds)
    spent = (r.cpu_seconds() - c for r, c in zip(replicas, cpu, strict=True))
    figure(rows, "gateways: CPU over the idle window [s]", label,
           each(f"{value:.1f}" for value in spent))  # fmt: skip
    figure(rows, "gateways: peak RSS after the idle window [MiB]", label,
           each(f"{r.peak_rss_mib():.0f}" for r in replicas))  # fmt: skip
    return rates


RESTARTED_WATCH_SECONDS = 10.0
"""How long the restarted gateway's loop lag is watched after its /readyz first says ready."""


def restarted_lag(replica: Replica, *, rows: Rows, label: str) -> None:
    """The restarted replica's loop lag split where its /readyz is first seen to answer 200
    (polled every 0.1 s): before it (discovery of the whole fleet, the routing state's warm-up:
    no request is routed to it yet) and the `RESTARTED_WATCH_SECONDS` after it. Its largest lag
    since it started, the row after this, counts both."""
    wait("the restarted gateway's /readyz", replica.ready, timeout=120, every=0.1)
    text = replica.metrics()
    whole, own = lag_buckets(replica, text), own_lag_buckets(replica, text)
    time.sleep(RESTARTED_WATCH_SECONDS)
    text = replica.metrics()
    after, own_after = lag_buckets(replica, text), own_lag_buckets(replica, text)
    figure(rows, "gateway restarted: lag max until ready / 10 s after [ms]", label,
           f"{lag_largest({}, whole)} / {lag_largest(whole, after)}")  # fmt: skip
    figure(rows, "  the same, own lag [ms]", label,
           f"{lag_largest({}, own)} / {lag_largest(own, own_after)}")  # fmt: skip


def idle_gateways(kubeconfig: Path, namespace: str, args: argparse.Namespace,
                  source: Path | None, *, workdir: Path, rows: Rows,
                  label: str) -> dict[tuple[str, str], float]:  # fmt: skip
    """A commit's gateway replicas (the baseline's) beside its operator, for the idle window
    only: its request rates (returned), the replicas' CPU and RSS. A gateway from before
    issue 28 exports no discovered endpoints, so each gets `BASELINE_SETTLE_SECONDS` after its
    /metrics first answers to discover the fleet, instead of a check."""
    replicas = [Replica(kubeconfig, namespace, workdir / f"gateway-base-{i}.log", source)
                for i in range(args.gateways)]  # fmt: skip
    try:
        wait("the baseline's gateways", lambda: all(r.metrics() for r in replicas), timeout=120,
             every=1)  # fmt: skip
        time.sleep(BASELINE_SETTLE_SECONDS)
        return idle_window(kubeconfig, replicas, args, rows=rows, label=label)
    finally:
        for replica in replicas:
            replica.stop()


def loaded(kubeconfig: Path, replicas: list[Replica], args: argparse.Namespace, *,
           workdir: Path, rows: Rows, label: str) -> None:  # fmt: skip
    """The same open loop through the replicas of the whole fleet and through as many of
    `SMALL_SERVICES` services, one stand-in engine behind every pod IP (_fleet_load.py)."""
    answer_pod_ips()
    engine = Engine(workdir / "engine.log")
    small = [Replica(kubeconfig, SMALL_NAMESPACE, workdir / f"gateway-small-{i}.log")
             for i in range(len(replicas))]  # fmt: skip
    each = " / ".join
    try:
        wait_discovered(small, SMALL_SERVICES, SMALL_SERVICES * args.pods_per_service)
        for name, gateways, count, model in (
            ("10 services", small, SMALL_SERVICES, SMALL_MODEL),
            (f"{args.services} services", replicas, args.services, MODEL),
        ):
            models = [f"{model}-{i}" for i in range(count)]
            print(f"{args.load_rate:.0f} req/s for {args.load_seconds:.0f} s through the "
                  f"gateways of {name} ...", flush=True)  # fmt: skip
            seen = under_load(gateways, models, args.load_rate, args.load_seconds)
            where = f"under load, {name}"
            figure(rows, f"{where}: sent", label, seen.sent())
            figure(rows, f"{where}: latency p50 / p99 [ms]", label, seen.latency_ms())
            figure(rows, f"{where}: event-loop lag max <= [ms]", label, each(seen.lag_max_ms))
            figure(rows, f"{where}: own event-loop lag max <= [ms]", label,
                   each(seen.own_lag_max_ms))  # fmt: skip
            figure(rows, f"{where}: loop thread waited for a CPU [ms]", label,
                   each(seen.cpu_wait_ms))  # fmt: skip
            figure(rows, f"{where}: full GC pause max <= [ms]", label, each(seen.gc_max_ms))
            figure(rows, f"{where}: full GC CPU max <= [ms]", label, each(seen.gc_cpu_max_ms))
            figure(rows, f"{where}: gateway CPU [s]", label,
                   each(f"{value:.1f}" for value in seen.cpu_seconds))  # fmt: skip
            figure(rows, f"{where}: engine scrapes [/s]", label,
                   each(f"{value / args.load_seconds:.0f}" for value in seen.scrapes))  # fmt: skip
    finally:
        for replica in small:
            replica.stop()
        engine.stop()


def restarted(kubeconfig: Path, namespace: str, operator: Operator, source: Path | None, *,
              args: argparse.Namespace, workdir: Path, rows: Rows,
              label: str) -> Operator:  # fmt: skip
    """The operator (this checkout's, or with `source` a baseline's) stopped and started again;
    a change made at its start (to the last service by name, which the timed changes leave
    alone) is timed until its Deployment has it."""
    operator.stop()
    fresh = Operator(kubeconfig, [namespace], workdir / f"operator-restarted-{namespace}.log",
                     args.resync_seconds, source)  # fmt: skip
    target = args.pods_per_service + 1
    patch = f'{{"spec":{{"topology":{{"unified":{{"replicas":{target}}}}}}}}}'
    last = f"svc-{args.services - 1:04d}"
    kubectl(kubeconfig, "patch", f"inferenceservices.llmfleet.dev/{last}", "-n", namespace,
            "--type=merge", "-p", patch)  # fmt: skip

    def acted() -> bool:
        found = kubectl(kubeconfig, "get", f"deployment/{last}-unified", "-n", namespace,
                        "-o", "jsonpath={.spec.replicas}")  # fmt: skip
        return found.strip() == str(target)

    wait("the restarted operator", acted, timeout=600, every=0.1)
    figure(rows, "operator restarted: until a change acted on [s]", label,
           f"{time.monotonic() - fresh.started:.1f}")  # fmt: skip
    figure(rows, "operator restarted: serving / listed / first pass [s]", label,
           fresh.start_steps())  # fmt: skip
    return fresh


def report(args: argparse.Namespace, columns: dict[str, dict[tuple[str, str], float]],
           ready: dict[str, float], rows: Rows) -> None:  # fmt: skip
    names = list(columns)
    print(
        f"\n{args.services} services x {args.pods_per_service} pods, kwok nodes; idle window "
        f"{args.idle_seconds:.0f} s, operator resync {args.resync_seconds:.0f} s; "
        "API requests per second counted by the API server (apiserver_request_total)\n"
    )
    print(f"{'verb resource':44}" + "".join(f"{name:>28}" for name in names))
    keys = sorted({key for column in columns.values() for key in column})
    for key in keys:
        print(
            f"{key[0] + ' ' + key[1]:44}"
            + "".join(f"{columns[name].get(key, 0.0):>28.2f}" for name in names)
        )
    for title, verbs in (("all writes", WRITES), ("all reads", None)):
        totals = [sum(rate for (verb, _), rate in columns[name].items()
                      if (verb in WRITES) == (verbs is not None)) for name in names]  # fmt: skip
        print(f"{title:44}" + "".join(f"{total:>28.2f}" for total in totals))
    print(f"{'from the first apply until all Ready [s]':44}"
          + "".join(f"{ready[n]:>28.1f}" for n in names))  # fmt: skip
    if args.gateways:
        print(f"\n{args.gateways} gateway replicas beside this checkout's operator; "
              f"{args.changes} changes (one service's replicas up one, then back)")  # fmt: skip
    for name, values in rows.items():
        print(f"{name:60}" + "".join(f"{values.get(n, '-'):>28}" for n in names))
    print(*_audit.section(args.audit_log, dict(zip(names, IDLE_WINDOWS, strict=True))), sep="\n")
    if STALLS:
        print("\nevent-loop stalls seen by the probe (_stall_probe.py; it costs CPU itself)")
        print(*STALLS, sep="\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--services", type=int, default=20)
    parser.add_argument("--pods-per-service", type=int, default=1)
    parser.add_argument("--idle-seconds", type=float, default=60)
    parser.add_argument("--resync-seconds", type=float, default=10)
    parser.add_argument("--baseline", help="a commit whose operator runs beside this one")
    parser.add_argument("--gateways", type=int, default=2, help="gateway replicas (0: none)")
    parser.add_argument("--changes", type=int, default=50, help="replica changes to time")
    parser.add_argument(
        "--load-rate",
        type=float,
        default=600,
        help="requests/s through the gateways (0: no load phase)",
    )
    parser.add_argument("--load-seconds", type=float, default=30)
    parser.add_argument(
        "--autoscaler",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the autoscaler with a Prometheus holding the series (_autoscaler.py)",
    )
    parser.add_argument("--kubeconfig", type=Path, help="use this cluster instead of a new one")
    parser.add_argument(
        "--plain",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the plain Deployments' column (same pods, no operator)",
    )
    parser.add_argument(
        "--stall-probe",
        type=Path,
        metavar="DIR",
        help="run the gateways through _stall_probe.py, its records kept in DIR",
    )
    args = parser.parse_args()
    if args.stall_probe:
        args.stall_probe.mkdir(parents=True, exist_ok=True)
    problem = netns.isolation_problem()
    if problem is not None:
        sys.exit(f"control_plane_scale: {problem}")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        if args.kubeconfig:
            args.audit_log = None
            run(args.kubeconfig, args, workdir)
            return
        cluster = LocalCluster("llmfleet-bench-cp", state=workdir / "state")
        # Room for the changes too: a pod taken away drains (holding its GPU) for the
        # operator's drain period while the next changes add pods.
        pods = (args.services + SMALL_SERVICES) * args.pods_per_service + args.changes
        nodes = -(-pods // 8) + 1
        print(f"starting a cluster with {nodes} nodes x 8 H100 ...", flush=True)
        cluster.up(node_count=nodes, gpus_per_node=8, gpu_type="H100", audit_log=True)
        args.audit_log = cluster.audit_log
        try:
            run(cluster.kubeconfig, args, workdir)
        finally:
            cluster.down()


if __name__ == "__main__":
    main()
