"""Benchmark: one gateway in front of a fleet, without a cluster: its event-loop lag, garbage
collection pauses and latency under load at 1,000 services against 10 (issue 28).

    .venv/bin/llmfleet isolated -- .venv/bin/python bench/gateway_fleet_scale.py \\
        [--services 1000 --pods-per-service 10] [--rate 600 --seconds 20 --rounds 3] \\
        [--baseline REV]

bench/control_plane_scale.py measures the same load through gateways that discover a real
cluster, with everything else of the control plane beside them; a run takes 40 minutes at
1,000 x 10. This one isolates the gateway, so a change to it can be measured in minutes and
beside a baseline commit's gateway in the same run:
- each gateway reads a static config of `--services` services x `--pods-per-service` engines,
  each engine an address of the pod network made local to the run's namespace (as
  control_plane_scale does: `_fleet_load.answer_pod_ips`), one stand-in engine
  (bench/fake_engine.py) answering for all of them; and as many gateways with `--small-services`
  (10) services of as many engines each;
- every round sends the same open loop (Poisson arrivals, `--rate` req/s for `--seconds`,
  services drawn Zipf-like: `_fleet_load.requests_for`) through each gateway in turn, the order
  rotating per round; the gateways not under load meanwhile idle (no traffic: nothing scraped);
- each figure comes from the gateway's own /metrics, read before and after its phase: the
  largest event-loop lag (bucket bound) and the samples later than 5 ms, the same of its own
  lag (each sample less the time the loop's thread waited for a CPU meanwhile, as the kernel
  counts it: on two cores the load generator and the engine compete with the gateway; "-" for a
  gateway without that histogram) and that wait in all; the full (generation 2)
  collections, their largest pause (bucket bound) and those longer than 5 ms; its CPU; engine
  scrapes per second; heap freezes after long collections (`gc_refreezes`, where the gateway
  has them). Every `--metrics-every` seconds (15) during the phase the gateway's /metrics is read,
  as Prometheus would scrape it: at 1,000 services that is ~60,000 series to render. Latency is
  the load generator's (this process: a Python client on the same two cores, so its own delays
  are in every figure alike).
The table gives each round's figures; compare within a round, and the medians below it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil
import yaml
from _fleet_load import Engine, UnderLoad, answer_pod_ips, under_load
from _gateways import GC_PAUSE, LAG, buckets, cpu_seconds, lag_largest, stop_process
from _support import checkout, free_port, revision_env

from llmfleet.core import loopback, netns
from llmfleet.core.cluster import local

ENGINE_PORT = 8000
SLOW_SECONDS = 0.005
"""The issue's goal for the loop lag: samples and pauses past it are counted."""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--services", type=int, default=1000)
    parser.add_argument("--pods-per-service", type=int, default=10)
    parser.add_argument("--small-services", type=int, default=10)
    parser.add_argument("--rate", type=float, default=600, help="open-loop req/s")
    parser.add_argument("--seconds", type=float, default=20, help="per phase")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--metrics-every", type=float, default=15,
                        help="read each gateway's /metrics this often during its phase, as "
                             "Prometheus does (0: only before and after)")  # fmt: skip
    parser.add_argument("--baseline", metavar="REV", help="also the gateway of this git revision")
    return parser.parse_args()


def static_config(services: int, pods: int, path: Path) -> list[str]:
    """A static config of `services` x `pods` engines on pod-network addresses; the models."""
    models = {}
    for i in range(services):
        endpoints = []
        for j in range(pods):
            n = i * pods + j + 1  # 10.0.0.1 on: host addresses of the /16, as kwok's pods have
            endpoints.append(f"http://10.0.{n // 256}.{n % 256}:{ENGINE_PORT}")
        models[f"org/model-{i}"] = {"namespace": "bench", "service": f"svc-{i:04d}",
                                    "unified": endpoints}  # fmt: skip
    path.write_text(yaml.safe_dump({"models": models}))
    return list(models)


class Gateway:
    """`llmfleet gateway --static-config` of this checkout (or of `source`) on a free port; the
    interface `_fleet_load.under_load` reads (port, metrics, cpu_seconds)."""

    def __init__(self, config: Path, log: Path, source: Path | None) -> None:
        self.port = free_port()
        command = [sys.executable, "-m", "llmfleet.core.cli", "gateway", "--static-config",
                   str(config), "--port", str(self.port)]  # fmt: skip
        # The pod network is allowed: it exists only in the run's namespace (_fleet_load.py).
        env = {**os.environ, "LLMFLEET_LOOPBACK_ONLY": "true",
               loopback.NETWORKS_ENV: local.POD_NETWORK}  # fmt: skip
        env = revision_env(source, env)
        self.log = log
        with log.open("w") as out:
            self.process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        self._ps = psutil.Process(self.process.pid)
        deadline = time.monotonic() + 120
        while not self.metrics():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the gateway did not start:\n{log.read_text()[-2000:]}")
            time.sleep(0.2)

    def metrics(self) -> str:
        try:
            url = f"http://127.0.0.1:{self.port}/metrics"
            with urllib.request.urlopen(url, timeout=10) as response:
                return str(response.read().decode())
        except OSError:
            return ""

    def cpu_seconds(self) -> float:
        return cpu_seconds(self._ps)

    def stop(self) -> None:
        stop_process(self.process)


@dataclass
class Phase:
    """One gateway's figures over one load phase, from its /metrics before and after."""

    seen: UnderLoad
    lag: tuple[dict[float, float], dict[float, float]]
    """The loop-lag histogram's buckets before and after."""
    full: tuple[dict[float, float], dict[float, float]]
    """The full (generation 2) collections' pause histogram's, as `lag`."""
    refreezes: float | None
    own: tuple[dict[float, float], dict[float, float]]
    """The own loop-lag histogram's (lag less the wait for a CPU), as `lag`."""
    cpu_wait: float | None
    """Seconds the loop's thread waited for a CPU during the phase."""

    def slow(self, which: str) -> tuple[float, float]:
        """(samples, samples above SLOW_SECONDS) of `which` ("lag", "own" or "full")."""
        before, after = {"lag": self.lag, "own": self.own, "full": self.full}[which]
        inf = float("inf")
        total = after.get(inf, 0.0) - before.get(inf, 0.0)
        return total, total - (after.get(SLOW_SECONDS, 0.0) - before.get(SLOW_SECONDS, 0.0))


def _counter(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


LAG_PREFIX = f"{LAG}_bucket{{"
FULL_PREFIX = f'{GC_PAUSE}_bucket{{generation="2",'
REFREEZES = "llmfleet_gateway_gc_refreezes_total"
OWN_PREFIX = "llmfleet_gateway_event_loop_own_lag_seconds_bucket{"
CPU_WAIT = "llmfleet_gateway_event_loop_cpu_wait_seconds_total"


def measure(gateway: Gateway, models: list[str], args: argparse.Namespace) -> Phase:
    text = gateway.metrics()
    lag, full = buckets(gateway, LAG_PREFIX, text), buckets(gateway, FULL_PREFIX, text)
    frozen = _counter(text, REFREEZES)
    own, waited = buckets(gateway, OWN_PREFIX, text), _counter(text, CPU_WAIT)
    done = threading.Event()
    scraping = threading.Thread(target=_scrape, args=(gateway, args.metrics_every, done))
    scraping.start()
    try:
        seen = under_load([gateway], models, args.rate, args.seconds)
    finally:
        done.set()
        scraping.join()
    text = gateway.metrics()
    after, waited_after = _counter(text, REFREEZES), _counter(text, CPU_WAIT)
    return Phase(
        seen,
        (lag, buckets(gateway, LAG_PREFIX, text)),
        (full, buckets(gateway, FULL_PREFIX, text)),
        None if after is None or frozen is None else after - frozen,
        (own, buckets(gateway, OWN_PREFIX, text)),
        None if waited is None or waited_after is None else waited_after - waited,
    )


def _scrape(gateway: Gateway, every: float, done: threading.Event) -> None:
    """Read the gateway's /metrics every `every` seconds until `done`, the first read a third
    of the way in (Prometheus's scrapes are not aligned with the load)."""
    if every <= 0:
        return
    wait = every / 3
    while not done.wait(wait):
        gateway.metrics()
        wait = every


def row(phase: Phase) -> list[str]:
    seen = phase.seen
    lag_samples, slow_lag = phase.slow("lag")
    own_samples, slow_own = phase.slow("own")
    collections, slow_full = phase.slow("full")
    return [
        seen.sent(),
        seen.latency_ms(),
        lag_largest(*phase.lag),
        f"{slow_lag:.0f} of {lag_samples:.0f}",
        lag_largest(*phase.own),
        f"{slow_own:.0f} of {own_samples:.0f}" if own_samples else "-",
        "-" if phase.cpu_wait is None else f"{phase.cpu_wait * 1000:.0f}",
        f"{collections:.0f}",
        lag_largest(*phase.full),
        f"{slow_full:.0f}",
        f"{seen.cpu_seconds[0]:.1f}",
        f"{seen.scrapes[0] / seen.seconds:.0f}",
        "-" if phase.refreezes is None else f"{phase.refreezes:.0f}",
    ]


COLUMNS = ["sent", "p50 / p99 [ms]", "lag max <= [ms]", "lag > 5 ms", "own lag max <= [ms]",
           "own lag > 5 ms", "CPU wait [ms]", "full GCs",
           "GC max <= [ms]", "GC > 5 ms", "CPU [s]", "scrapes/s", "refreezes"]  # fmt: skip


def main() -> None:
    args = parse_args()
    problem = netns.isolation_problem()
    if problem:  # the pod network is made local to the namespace: only ever inside one
        raise SystemExit(problem)
    workdir = Path(tempfile.mkdtemp(prefix="gateway-fleet-"))
    answer_pod_ips()
    engine = Engine(workdir / "engine.log")
    fleets = {
        "big": (args.services, static_config(args.services, args.pods_per_service,
                                             workdir / "big.yaml")),
        "small": (args.small_services, static_config(args.small_services,
                                                     args.pods_per_service,
                                                     workdir / "small.yaml")),
    }  # fmt: skip
    sources: dict[str, Path | None] = {"this checkout": None}
    if args.baseline:
        sources[f"@{args.baseline}"] = checkout(args.baseline, workdir / "base")
    gateways: dict[tuple[str, str], Gateway] = {}
    print(f"gateways of {args.services} x {args.pods_per_service} and {args.small_services} x "
          f"{args.pods_per_service} engines, {args.rate:.0f} req/s for {args.seconds:.0f} s per "
          f"phase, {args.rounds} rounds; {os.cpu_count()} CPUs; work dir {workdir}",
          flush=True)  # fmt: skip
    results: dict[tuple[str, str], list[Phase]] = {}
    try:
        for name, source in sources.items():
            for fleet in fleets:
                gateways[name, fleet] = Gateway(
                    workdir / f"{fleet}.yaml",
                    workdir / f"gateway-{fleet}-{len(gateways)}.log",
                    source,
                )
        order = list(gateways)
        for index in range(args.rounds):
            shift = index % len(order)
            for key in order[shift:] + order[:shift]:
                phase = measure(gateways[key], fleets[key[1]][1], args)
                results.setdefault(key, []).append(phase)
                print(f"round {index + 1}: {key[0]}, {fleets[key[1]][0]} services: "
                      + ", ".join(f"{c} {v}" for c, v in zip(COLUMNS, row(phase), strict=True)),
                      flush=True)  # fmt: skip
    finally:
        for gateway in gateways.values():
            gateway.stop()
        engine.stop()
    report(results, fleets, args)


def report(results: dict[tuple[str, str], list[Phase]],
           fleets: dict[str, tuple[int, list[str]]], args: argparse.Namespace) -> None:  # fmt: skip
    print(f"\nEach round's figures, then their medians ({args.rounds} rounds)")
    print(f"{'gateway, services':32}" + "".join(f"{c:>21}" for c in COLUMNS))
    for (name, fleet), phases in results.items():
        label = f"{name}, {fleets[fleet][0]}"
        for index, phase in enumerate(phases):
            print(f"{label + f' r{index + 1}':32}" + "".join(f"{v:>21}" for v in row(phase)))
    print(f"\n{'medians':32}{'p50 / p99 [ms]':>18}{'lag > 5 ms':>18}{'own lag > 5 ms':>18}"
          f"{'GC > 5 ms':>18}{'CPU [s]':>18}")  # fmt: skip
    for (name, fleet), phases in results.items():
        p50 = statistics.median(_quantile(p.seen.load.latencies, 0.5) for p in phases)
        p99 = statistics.median(_quantile(p.seen.load.latencies, 0.99) for p in phases)
        slow = statistics.median(p.slow("lag")[1] / max(p.slow("lag")[0], 1) for p in phases)
        owned = [p.slow("own") for p in phases if p.slow("own")[0]]  # none: no such histogram
        own = f"{statistics.median(n / total for total, n in owned):.2%}" if owned else "-"
        full = statistics.median(p.slow("full")[1] for p in phases)
        cpu = statistics.median(p.seen.cpu_seconds[0] for p in phases)
        print(f"{name + ', ' + str(fleets[fleet][0]):32}{f'{p50:.1f} / {p99:.0f}':>18}"
              f"{slow:>18.2%}{own:>18}{full:>18.0f}{cpu:>18.1f}")  # fmt: skip


def _quantile(values: list[float], q: float) -> float:
    """The q-quantile of `values` in ms (the largest below 1/(1-q) values); 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


if __name__ == "__main__":
    main()
