"""The autoscaler's full-pass PromQL at fleet scale, without a cluster (issue 28).

Starts the stand-in exporter (`_fleet_metrics.py`) for `--services` services of
`--pods-per-service` pods each (one pool, `unified`, in one namespace) and a Prometheus 2.42
scraping it every 15 s (`_autoscaler.Prometheus`, the production scrape interval) and
evaluating the chart's rule files (its recording group `llmfleet.pools` every 15 s, as in
production), waits until every pod's rates have two samples and then `--warmup-seconds` more
(so the 1m windows hold what they hold in production: four samples) and until the autoscaler
would read the recorded series, then times, `--repeats` times each, medians:

1. the full pass as it is (`after`) beside the pass at git revision `--baseline` (`before`),
   measured in turn, repeat by repeat: the whole fleet's combined query (`combined_query` of
   `signal_queries`, the namespace matcher) as one HTTP call, and `PrometheusSignals.
   read_services` (HTTP and parse): the revision's, this checkout's raw read in one query and
   with its defaults (chunks of services, bounded concurrency), and this checkout's read of
   the recorded series (`recorded.py`, what the autoscaler reads by default when Prometheus
   has the chart's rules);
2. with `--signals`, each signal's expression alone, for every service (which signals cost
   what);
3. this checkout's combined query split by service: K chunks (`--chunks`), each its services'
   names as one `llmfleet_dev_service=~"a|b|..."` matcher, C at once (`--concurrency`): wall
   time of the whole pass, and the slowest chunk.

All of it against the same Prometheus in the same run, so the figures compare; the raw reads
share Prometheus' cores with its rule evaluation, as they would in production with the chart.
Prometheus' head series, its CPU over the measurements, each rule group's last evaluation time
(with its interval and missed evaluations) and the exporter's CPU close the output. Refuses to
start outside a loopback-only namespace.

    .venv/bin/llmfleet isolated -- nice .venv/bin/python bench/autoscaler_query_scale.py \\
        --services 300 --pods-per-service 2 [--baseline REV] [--signals] [--chunks 4,10] \\
        [--concurrency 1,2,4] [--repeats 3] [--warmup-seconds 45]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import psutil
import requests
from _autoscaler import SCRAPE_SECONDS, Prometheus, _wait
from _gateways import cpu_seconds, peak_rss_mib, stop_process
from _support import free_port

from llmfleet.autoscaler.signals import (
    PrometheusSignals,
    QueryOptions,
    combined_query,
    matchers,
    signal_queries,
)
from llmfleet.core import netns

BENCH = Path(__file__).resolve().parent
NAMESPACE = "bench"
POOL = "unified"


def pods(services: int, per_service: int) -> list[dict[str, str]]:
    """The fleet as `_fleet_metrics.read_pods` takes it (IPs are labels only: nothing is asked)."""
    found = []
    for s in range(services):
        for p in range(per_service):
            n = s * per_service + p + 1
            ip = f"10.{(n >> 16) & 255}.{(n >> 8) & 255}.{n & 255}"
            found.append(
                {
                    "namespace": NAMESPACE,
                    "pod": f"svc-{s:04d}-{p}",
                    "service": f"svc-{s:04d}",
                    "pool": POOL,
                    "ip": ip,
                }
            )
    return found


def chunk_matcher(names: Sequence[str]) -> str:
    """The namespace matcher plus one regex of the chunk's service names (bench names need no
    escaping: letters, digits and '-')."""
    return f'{matchers(NAMESPACE)},llmfleet_dev_service=~"{"|".join(names)}"'


def query(url: str, promql: str, timeout: float = 120) -> tuple[float, int]:
    """(seconds, samples returned) of one instant query, POSTed (a chunk's matcher makes a long
    query); raises on an error answer."""
    started = time.perf_counter()
    response = requests.post(f"{url}/api/v1/query", data={"query": promql}, timeout=timeout)
    taken = time.perf_counter() - started
    body = response.json()
    if body.get("status") != "success":
        raise RuntimeError(f"{body.get('errorType')}: {body.get('error')}")
    return taken, len(body["data"]["result"])


def chunked(url: str, queries: Sequence[str], concurrency: int) -> tuple[float, float, int]:
    """(wall seconds, slowest query's seconds, samples) of `queries` run `concurrency` at once."""
    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        done = list(pool.map(lambda q: query(url, q), queries))
    return time.perf_counter() - started, max(t for t, _ in done), sum(n for _, n in done)


def median_ms(run: Callable[[], float], repeats: int) -> str:
    return f"{statistics.median(run() for _ in range(repeats)) * 1000:.0f}"


def signals_of(rev: str) -> ModuleType:
    """`llmfleet.autoscaler.signals` as it was at git revision `rev` (it imports nothing of this
    checkout that its API depends on), for a before/after in one run."""
    source = subprocess.run(
        ["git", "show", f"{rev}:autoscaler/llmfleet/autoscaler/signals.py"],
        cwd=BENCH.parent, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    name = f"signals_at_{rev.replace('-', '_').replace('/', '_')}"
    spec = importlib.util.spec_from_loader(name, loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    exec(compile(source, f"{rev}:signals.py", "exec"), module.__dict__)
    return module


def timed_read(signals: Any, wanted: dict[tuple[str, str], list[str]]) -> Callable[[], float]:
    def run() -> float:
        started = time.perf_counter()
        signals.read_services(wanted)
        return time.perf_counter() - started

    return run


def measure(url: str, args: argparse.Namespace) -> list[tuple[str, str]]:
    options = QueryOptions()
    every = signal_queries(options, matchers(NAMESPACE))
    names = [f"svc-{s:04d}" for s in range(args.services)]
    wanted = {(NAMESPACE, name): [POOL] for name in names}
    now = PrometheusSignals(url, timeout_s=120, recorded_rules="off")
    one = PrometheusSignals(url, timeout_s=120, chunk_services=len(names), recorded_rules="off")
    recorded = PrometheusSignals(url, timeout_s=120)
    if recorded.source() != "recorded":
        raise SystemExit(f"no recorded series to read: {recorded.rules.problem}")
    # The pass as it is, beside the pass as it was: measured in turn, repeat by repeat, so that
    # both see the same machine.
    compared: dict[str, Callable[[], float]] = {}
    closing = [now, one, recorded]
    if args.baseline:
        before = signals_of(args.baseline)
        old = before.PrometheusSignals(url, timeout_s=120)
        closing.append(old)
        old_query = before.combined_query(
            before.signal_queries(before.QueryOptions(), before.matchers(NAMESPACE))
        )
        compared[f"before ({args.baseline}): one combined query, HTTP only [ms]"] = lambda: query(
            url, old_query
        )[0]
        compared[f"before ({args.baseline}): read_services (HTTP + parse) [ms]"] = timed_read(
            old, wanted
        )
    new_query = combined_query(every)
    compared["after: one combined query of every service, HTTP only [ms]"] = lambda: query(
        url, new_query
    )[0]
    compared["after: read_services in one query (HTTP + parse) [ms]"] = timed_read(one, wanted)
    compared[
        f"after: read_services (chunks of {now.chunk_services}, {now.concurrency} at once) [ms]"
    ] = timed_read(now, wanted)
    compared[
        f"after: read_services from recorded series (chunks of {recorded.chunk_services}, "
        f"{recorded.concurrency} at once) [ms]"
    ] = timed_read(recorded, wanted)
    rows: list[tuple[str, str]] = []
    try:
        for run in compared.values():
            run()  # once unmeasured: Prometheus' caches, our connections
        taken: dict[str, list[float]] = {label: [] for label in compared}
        for _ in range(args.repeats):
            for label, run in compared.items():
                taken[label].append(run())
        rows += [(label, f"{statistics.median(t) * 1000:.0f}") for label, t in taken.items()]
        for label, signals in (("raw", now), ("recorded", recorded)):
            read = signals.read_services(wanted)
            found = sum(len(pools) for pools in read.values() if isinstance(pools, dict))
            rows.append((f"after, {label}: pools found (of services)", f"{found} ({len(names)})"))
    finally:
        for signals in closing:
            signals.close()
    if args.signals:
        for name, promql in every.items():
            alone = median_ms(lambda promql=promql: query(url, promql)[0], args.repeats)
            rows.append((f"  after, signal alone: {name} [ms]", alone))
    for k in args.chunks:
        size = -(-len(names) // k)
        parts = [names[i : i + size] for i in range(0, len(names), size)]
        queries = [combined_query(signal_queries(options, chunk_matcher(p))) for p in parts]
        for concurrency in args.concurrency:
            rows.append((f"after, split by service: {len(parts)} chunks of <= {size}, "
                         f"{concurrency} at once [ms] (slowest chunk)",
                         _chunked_ms(url, queries, concurrency, args.repeats)))  # fmt: skip
    return rows


def _chunked_ms(url: str, queries: Sequence[str], concurrency: int, repeats: int) -> str:
    runs = [chunked(url, queries, concurrency) for _ in range(repeats)]
    wall = statistics.median(r[0] for r in runs) * 1000
    slowest = statistics.median(r[1] for r in runs) * 1000
    return f"{wall:.0f} ({slowest:.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--services", type=int, default=300)
    parser.add_argument("--pods-per-service", type=int, default=2)
    parser.add_argument(
        "--chunks", type=lambda s: [int(x) for x in s.split(",") if x], default=[10]
    )
    parser.add_argument(
        "--concurrency", type=lambda s: [int(x) for x in s.split(",") if x], default=[2, 4]
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline", default="", help="git revision to compare with")
    parser.add_argument("--signals", action="store_true", help="time each signal alone too")
    parser.add_argument("--warmup-seconds", type=float, default=45.0)
    args = parser.parse_args()
    problem = netns.isolation_problem()
    if problem:
        raise SystemExit(problem)
    fleet = pods(args.services, args.pods_per_service)
    with tempfile.TemporaryDirectory(prefix="llmfleet-query-scale-") as tmp:
        workdir = Path(tmp)
        (workdir / "pods.json").write_text(json.dumps(fleet))
        port = free_port()
        exporter = subprocess.Popen(
            [
                sys.executable,
                str(BENCH / "_fleet_metrics.py"),
                "--pods",
                str(workdir / "pods.json"),
                "--port",
                str(port),
            ]
        )
        processes: list[subprocess.Popen[bytes]] = [exporter]
        try:
            prometheus = Prometheus(f"127.0.0.1:{port}", workdir / "prometheus", chart_rules=True)
            processes.append(prometheus.process)
            print(f"Prometheus scraping {len(fleet)} pods' stand-in series ...", flush=True)
            _wait(
                "two scrapes of every pod",
                lambda: (
                    prometheus.value("count(rate(vllm:request_success_total[1m]) > 0)")
                    >= len(fleet)
                ),
                timeout=SCRAPE_SECONDS * 12,
                every=2,
            )
            time.sleep(args.warmup_seconds)
            _wait(
                "the recorded series of every pool",
                lambda: (
                    prometheus.value("count(llmfleet_pool:time_to_first_token_seconds_bucket"
                                     ':increase1m{le="+Inf"} > 0)')
                    >= args.services
                ),
                timeout=SCRAPE_SECONDS * 8,
                every=2,
            )  # fmt: skip
            ps = psutil.Process(prometheus.process.pid)
            cpu = cpu_seconds(ps)
            started = time.monotonic()
            rows = measure(prometheus.url, args)
            rows += [
                (
                    "Prometheus: head series / peak RSS [MiB]",
                    f"{prometheus.head_series():.0f} / {peak_rss_mib(prometheus.process.pid):.0f}",
                ),
                (
                    f"Prometheus: CPU over the measurements ({time.monotonic() - started:.0f} s) "
                    "[s]",
                    f"{cpu_seconds(ps) - cpu:.1f}",
                ),
                ("stand-in exporter: CPU [s]", f"{cpu_seconds(psutil.Process(exporter.pid)):.1f}"),
            ]
            for group, (last, every, missed) in sorted(prometheus.rule_groups().items()):
                label = f"Prometheus: rule group {group}, every {every:.0f} s: last evaluation [s]"
                rows.append((f"{label} (missed)", f"{last:.2f} ({missed:.0f})"))
        finally:
            for process in reversed(processes):
                if process.poll() is None:
                    stop_process(process)
    print(
        f"\n{args.services} services x {args.pods_per_service} pods, {psutil.cpu_count()} CPUs, "
        f"medians of {args.repeats}"
    )
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key.ljust(width)}  {value}")


if __name__ == "__main__":
    main()
