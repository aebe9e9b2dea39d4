"""Request load through the gateway replicas at fleet scale, for bench/control_plane_scale.py.

The benchmark's pods are kwok's: each has an IP and nothing behind it. `answer_pod_ips` makes
the whole pod network local to the run's own network namespace (an address with the network's
prefix on `lo` makes every address in it local, as 127.0.0.0/8 is), so one stand-in engine,
bench/fake_engine.py listening on 0.0.0.0:8000, answers for every pod IP a gateway routes to
(the issue allows one process for many pod IPs: a process per pod does not fit two cores). This
only ever runs inside the namespace the benchmark runs in (`llmfleet isolated`): there, and only
there, the pod IPs exist.

`requests_for` spreads an open loop (bench/_load.py: Poisson arrivals, sent whatever earlier
answers do) over the gateway replicas in turn and over the services by a Zipf-like popularity:
the k-th most popular service gets a share ∝ 1/k, so a few services get most requests and every
service gets some, as in a fleet of many models (a uniform spread would be the harder case for
the gateway's scraper: every pool active at once).
"""

from __future__ import annotations

import asyncio
import bisect
import ipaddress
import json
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from _gateways import (
    Replica,
    cpu_wait_ms,
    gc_buckets,
    gc_cpu_buckets,
    lag_buckets,
    lag_largest,
    own_lag_buckets,
    p50_p99_ms,
)
from _load import LEAD_IN, OpenLoop, Request, arrivals, open_loop

from llmfleet.core.cluster.local import POD_NETWORK

ENGINE_PORT = 8000
HERE = Path(__file__).resolve().parent


def answer_pod_ips() -> None:
    """Every address of the pod network is this namespace's own (see the module)."""
    network = ipaddress.ip_network(POD_NETWORK)
    address = f"{network.broadcast_address - 1}/{network.prefixlen}"
    subprocess.run(["ip", "addr", "replace", address, "dev", "lo"], check=True)


class Engine:
    """bench/fake_engine.py on 0.0.0.0:8000: every pod IP's engine."""

    def __init__(self, log: Path) -> None:
        command = [sys.executable, str(HERE / "fake_engine.py"), "--ports", str(ENGINE_PORT),
                   "--host", "0.0.0.0"]  # fmt: skip
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE,
                                        stderr=log.open("w"), text=True)  # fmt: skip
        assert self.process.stdout is not None
        if self.process.stdout.readline().strip() != "ready":
            raise SystemExit(f"the stand-in engine did not start:\n{log.read_text()[-2000:]}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()


def popularity(count: int, seed: int = 7) -> list[float]:
    """Cumulative request shares of `count` services, Zipf-like (1/rank), the ranks shuffled so
    popularity does not follow the services' names (and their order of creation)."""
    ranks = list(range(1, count + 1))
    random.Random(seed).shuffle(ranks)
    weights = [1 / rank for rank in ranks]
    total, running, cumulative = sum(weights), 0.0, []
    for weight in weights:
        running += weight / total
        cumulative.append(running)
    return cumulative


def requests_for(gateways: list[str], models: list[str], arrivals: int,
                 seed: int = 11) -> list[Request]:  # fmt: skip
    """One request per arrival: the replicas in turn, a model drawn by popularity."""
    cumulative = popularity(len(models))
    draw = random.Random(seed)
    bodies = {}
    chosen = []
    for index in range(arrivals):
        pick = min(bisect.bisect_left(cumulative, draw.random()), len(models) - 1)
        body = bodies.get(pick)
        if body is None:
            body = bodies[pick] = json.dumps(
                {"model": models[pick], "prompt": "hello", "max_tokens": 8}
            ).encode()
        url = f"{gateways[index % len(gateways)]}/v1/completions"
        chosen.append(Request(url, body, {"Content-Type": "application/json"}))
    return chosen


@dataclass
class UnderLoad:
    """What `under_load` saw (per replica lists are in the replicas' order)."""

    load: OpenLoop
    rate: float
    seconds: float
    lag_max_ms: list[str]
    own_lag_max_ms: list[str]
    """The same less the loop thread's wait for a CPU (`loop_lag`), as `lag_max_ms`."""
    cpu_wait_ms: list[str]
    """How long each loop's thread waited for a CPU during the load."""
    gc_max_ms: list[str]
    """The longest full garbage collection, as `lag_max_ms` ("-": none ran)."""
    gc_cpu_max_ms: list[str]
    """The most CPU one full collection took, as `gc_max_ms` (the wall time less the
    collecting thread's waits for a CPU; "-" also for a gateway without the histogram)."""
    cpu_seconds: list[float]
    scrapes: list[float]

    def latency_ms(self) -> str:
        return p50_p99_ms(self.load.latencies)

    def sent(self) -> str:
        errors = f", {self.load.errors} errors" if self.load.errors else ""
        dropped = f", {self.load.dropped} dropped" if self.load.dropped else ""
        return f"{self.load.sent / (self.seconds + LEAD_IN):.0f} req/s{errors}{dropped}"


def under_load(replicas: list[Replica], models: list[str], rate: float,
               seconds: float) -> UnderLoad:  # fmt: skip
    """An open loop of `rate` requests/s for `seconds` through `replicas`, over `models`; each
    replica's largest event-loop lag during it (bucket bound), CPU and engine scrapes."""
    texts = [replica.metrics() for replica in replicas]
    before = [lag_buckets(r, t) for r, t in zip(replicas, texts, strict=True)]
    gc_before = [gc_buckets(r, t) for r, t in zip(replicas, texts, strict=True)]
    gc_cpu_before = [gc_cpu_buckets(r, t) for r, t in zip(replicas, texts, strict=True)]
    own_before = [own_lag_buckets(r, t) for r, t in zip(replicas, texts, strict=True)]
    texts_before = texts
    scraped = [_scrapes(t) for t in texts]
    cpu = [replica.cpu_seconds() for replica in replicas]
    schedule = arrivals(rate, seconds, seed=3)
    urls = [f"http://127.0.0.1:{replica.port}" for replica in replicas]
    load = asyncio.run(open_loop(requests_for(urls, models, len(schedule)), schedule, False))
    spent = [r.cpu_seconds() - cpu[i] for i, r in enumerate(replicas)]
    texts = [replica.metrics() for replica in replicas]
    return UnderLoad(
        load=load, rate=rate, seconds=seconds,
        lag_max_ms=[lag_largest(before[i], lag_buckets(r, texts[i]))
                    for i, r in enumerate(replicas)],
        own_lag_max_ms=[lag_largest(own_before[i], own_lag_buckets(r, texts[i]))
                        for i, r in enumerate(replicas)],
        cpu_wait_ms=[cpu_wait_ms(texts_before[i], texts[i]) for i in range(len(replicas))],
        gc_max_ms=[lag_largest(gc_before[i], gc_buckets(r, texts[i]))
                   for i, r in enumerate(replicas)],
        gc_cpu_max_ms=[lag_largest(gc_cpu_before[i], gc_cpu_buckets(r, texts[i]))
                       for i, r in enumerate(replicas)],
        cpu_seconds=spent,
        scrapes=[_scrapes(t) - scraped[i] for i, t in enumerate(texts)],
    )  # fmt: skip


def _scrapes(text: str) -> float:
    """Engine scrapes a replica has started so far (every outcome), from its /metrics `text`."""
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("llmfleet_gateway_scrapes_total{"))  # fmt: skip
