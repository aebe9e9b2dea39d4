"""The autoscaler's full-pass PromQL at fleet scale, without a cluster (issue 28).

Starts the stand-in exporter (`_fleet_metrics.py`) for `--services` services of
`--pods-per-service` pods each (one pool, `unified`, in one namespace) and a Prometheus 2.42
scraping it every 15 s (`_autoscaler.Prometheus`, the production scrape interval), waits until
every pod's rates have two samples and then `--warmup-seconds` more (so the 1m windows hold
what they hold in production: four samples), then times, `--repeats` times each, medians:

1. baseline: the full pass's query as one expression for every service (`combined_query` of
   `signal_queries`, the namespace matcher), as one HTTP call and as `PrometheusSignals.
   read_services` of this checkout (HTTP, parse, its own settings: one call or chunks);
2. each signal's expression alone, for every service (which signals cost what);
3. the combined query split by service: K chunks, each its services' names as one
   `llmfleet_dev_service=~"a|b|..."` matcher, run with bounded concurrency C (wall time of the
   whole pass, and the slowest chunk).

All of it against the same Prometheus in the same run, one after another, so the figures
compare. Prometheus' head series, its CPU over the measurements and the exporter's CPU close
the output. Refuses to start outside a loopback-only namespace.

    .venv/bin/llmfleet isolated -- nice .venv/bin/python bench/autoscaler_query_scale.py \\
        --services 300 --pods-per-service 2 [--chunks 4,10,20] [--concurrency 1,2,4] \\
        [--repeats 3] [--warmup-seconds 60]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import requests
from _autoscaler import SCRAPE_SECONDS, Prometheus, _stop, _wait
from _gateways import cpu_seconds, peak_rss_mib
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


def measure(url: str, args: argparse.Namespace) -> list[tuple[str, str]]:
    options = QueryOptions()
    every = signal_queries(options, matchers(NAMESPACE))
    combined = combined_query(every)
    names = [f"svc-{s:04d}" for s in range(args.services)]
    rows: list[tuple[str, str]] = []
    _, samples = query(url, combined)  # once unmeasured: Prometheus' caches, our connection
    rows.append(
        (
            "baseline: one combined query, every service [ms] (samples)",
            f"{median_ms(lambda: query(url, combined)[0], args.repeats)} ({samples})",
        )
    )
    wanted = {(NAMESPACE, name): [POOL] for name in names}
    signals = PrometheusSignals(url, timeout_s=120)
    try:
        read = signals.read_services(wanted)
        found = sum(len(pools) for pools in read.values())

        def read_services() -> float:
            started = time.perf_counter()
            signals.read_services(wanted)
            return time.perf_counter() - started

        rows.append(
            (
                "this checkout's read_services (HTTP + parse) [ms] (pools found)",
                f"{median_ms(read_services, args.repeats)} ({found} of {len(names)})",
            )
        )
    finally:
        signals.close()
    for name, promql in every.items():
        rows.append(
            (
                f"  signal alone: {name} [ms]",
                median_ms(lambda promql=promql: query(url, promql)[0], args.repeats),
            )
        )
    for concurrency in args.concurrency:
        split = [combined_query({n: q}) for n, q in every.items()]
        rows.append(
            (
                f"split by signal: 16 queries, {concurrency} at once [ms] (slowest)",
                _chunked_ms(url, split, concurrency, args.repeats),
            )
        )
    for k in args.chunks:
        size = -(-len(names) // k)
        parts = [names[i : i + size] for i in range(0, len(names), size)]
        queries = [combined_query(signal_queries(options, chunk_matcher(p))) for p in parts]
        for concurrency in args.concurrency:
            rows.append(
                (
                    f"split by service: {len(parts)} chunks of <= {size}, {concurrency} at "
                    "once [ms] (slowest chunk)",
                    _chunked_ms(url, queries, concurrency, args.repeats),
                )
            )
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
        "--chunks", type=lambda s: [int(x) for x in s.split(",")], default=[4, 10, 20]
    )
    parser.add_argument(
        "--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4]
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup-seconds", type=float, default=60.0)
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
            prometheus = Prometheus(f"127.0.0.1:{port}", workdir / "prometheus")
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
        finally:
            for process in reversed(processes):
                if process.poll() is None:
                    _stop(process)
    print(
        f"\n{args.services} services x {args.pods_per_service} pods, {psutil.cpu_count()} CPUs, "
        f"medians of {args.repeats}"
    )
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key.ljust(width)}  {value}")


if __name__ == "__main__":
    main()
