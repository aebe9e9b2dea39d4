"""Benchmark: what a gateway adds to every request, llmfleet beside vLLM's router and LiteLLM.

    make bench-peers        # once: vllm-router, LiteLLM's proxy, py-spy, oha (pinned)
    .venv/bin/llmfleet isolated -- .venv/bin/python bench/gateway_overhead.py [--quick]

In one run, against the same fake engines (bench/fake_engine.py: two engines in one process,
answers in microseconds): `direct` (client -> first engine), `llmfleet` (`llmfleet gateway` of
this checkout), `vllm-router` and `LiteLLM` (each from its own venv under
~/.cache/llmfleet/bench-peers/), and with `--baseline REV` the llmfleet gateway of a git
revision. Every proxy is pinned to one CPU, the engines to another, the load generators (this
process and oha) to a third where there is one, else beside the engines. Each round runs every
phase against every target (their order rotating per round); each figure is the median of the
rounds' figures:

1. open loop, Poisson arrivals, non-streaming chat completions at each `--rates` (100, 300, 600
   req/s): added p50/p99 (target minus direct of the same round);
2. open loop, streamed chat completions at `--stream-rate` (150/s): time to first event added;
3. closed loop with oha (`--connections` 64): answers per second on the gateway's one core, and
   its latency;
4. `/v1/completions` with a `--prompt-tokens` (100,000) token-id prompt, one at a time: added
   median of `--prompt-repeats` (20);
5. CPU per request of each phase: the proxy's process CPU time (/proc/PID/stat, children
   included) over the phase divided by the requests sent, and how busy its core was;
6. garbage collection pauses of the llmfleet gateways per phase (bench/gc_probe.py times every
   collection; the gateway's own `llmfleet_gateway_gc_pause_seconds`, where it exists, too).

A peer that is not installed or does not start prints "n/a: why". Everything binds 127.0.0.1;
the run refuses to start outside a loopback-only namespace (`llmfleet isolated`), since a peer
could try to reach the internet. `--profile DIR` runs no benchmark: it records py-spy flame
graphs of the llmfleet gateway(s) at 300 req/s instead (bench/_profile.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import httpx
import uvloop
from _load import LEAD_IN, ClosedLoop, OpenLoop, Request, arrivals, closed_loop, open_loop
from _load import sequential as one_at_a_time
from _profile import record
from _report import TROUBLE_SHARE, Ledger, Measured, ms, quantile, report
from _targets import (
    MODEL,
    OHA,
    PY_SPY,
    Absent,
    Fleet,
    Pinning,
    Target,
    collections,
    core_busy_seconds,
    installed_version,
    process_cpu_seconds,
    settle,
    worktree,
)

from llmfleet.core import netns

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "hello there"}]
GC_METRIC = "llmfleet_gateway_gc_pause_seconds_bucket"
T = TypeVar("T")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rates", default="100,300,600", help="open-loop req/s, comma-separated")
    parser.add_argument("--seconds", type=float, default=10, help="per open-loop phase")
    parser.add_argument("--stream-rate", type=float, default=150)
    parser.add_argument("--stream-chunks", type=int, default=16)
    parser.add_argument("--chunk-interval-ms", type=float, default=2.0)
    parser.add_argument("--connections", type=int, default=64, help="closed loop (oha)")
    parser.add_argument("--max-seconds", type=float, default=10, help="closed loop duration")
    parser.add_argument("--prompt-tokens", type=int, default=100_000)
    parser.add_argument("--prompt-repeats", type=int, default=20)
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--routing-profile", default="prefix-load", help="llmfleet's profile")
    parser.add_argument("--router-policy", default="cache_aware", help="vllm-router's --policy")
    parser.add_argument("--peers", default="vllm-router,litellm", help="comma-separated, or ''")
    parser.add_argument("--baseline", metavar="REV", help="also the gateway of this git revision")
    parser.add_argument(
        "--profile",
        metavar="DIR",
        type=Path,
        help="instead of the benchmark: py-spy flame graphs of the llmfleet gateway(s) at "
        "--profile-rate req/s into DIR (NAME.svg, NAME-top.txt, NAME.collapsed)",
    )
    parser.add_argument("--profile-rate", type=float, default=300)
    parser.add_argument("--profile-seconds", type=float, default=10)
    parser.add_argument("--quick", action="store_true", help="a short smoke run: 1 round, 2 s")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.seconds, args.max_seconds, args.prompt_repeats = 1, 2, 2, 5
        args.profile_seconds = min(args.profile_seconds, 3)
    args.rates = [float(rate) for rate in args.rates.split(",")]
    args.peers = [peer for peer in args.peers.split(",") if peer]
    return args


def main() -> None:
    args = parse_args()
    problem = netns.isolation_problem()
    if problem:
        raise SystemExit(f"gateway_overhead: {problem}")
    pinning = Pinning.for_this_machine()
    if pinning.client is not None:
        os.sched_setaffinity(0, {pinning.client})
    with tempfile.TemporaryDirectory(prefix="gateway-overhead-") as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        source = None
        if args.baseline:
            source = stack.enter_context(worktree(args.baseline, workdir / "baseline"))
        with Fleet(pinning, workdir) as fleet:
            engines = fleet.engines(args.engines, args.stream_chunks, args.chunk_interval_ms)
            targets, absent = start_targets(fleet, engines, args, source)
            if args.profile:
                profile(targets, pinning, args)
                return
            print(header(targets, absent, pinning, args), flush=True)
            ledger = Ledger()
            rounds = [run_round(i, targets, args, pinning, ledger) for i in range(args.rounds)]
            overhead = {t.name: overhead_mean(t.url) for t in targets if t.gc_file}
            pauses = {t.name: collections(t) for t in targets if t.gc_file}
        columns = [target.name for target in targets]
        print(report(rounds, columns, absent, ledger=ledger, pauses=pauses, args=args))
        for name, mean in overhead.items():
            print(f"{name}'s own llmfleet_gateway_overhead_seconds: mean {mean}")


def start_targets(
    fleet: Fleet, engines: list[str], args: argparse.Namespace, source: Path | None
) -> tuple[list[Target], dict[str, str]]:
    targets = [Target("direct", engines[0])]
    absent: dict[str, str] = {}

    def current() -> Target | Absent:
        return fleet.llmfleet("llmfleet", engines, args.routing_profile)

    candidates: list[Callable[[], Target | Absent]] = [current]
    if source is not None:
        candidates.append(lambda: fleet.llmfleet("baseline", engines, args.routing_profile, source))
    if "vllm-router" in args.peers and not args.profile:
        candidates.append(lambda: fleet.vllm_router(engines, args.router_policy))
    if "litellm" in args.peers and not args.profile:
        candidates.append(lambda: fleet.litellm(engines))
    for start in candidates:
        started = start()
        if isinstance(started, Absent):
            absent[started.name] = started.reason
        else:
            targets.append(started)
    if not OHA.exists():
        absent["oha"] = f"{OHA} missing (make bench-peers): no closed-loop figures"
    return targets, absent


def header(
    targets: list[Target], absent: dict[str, str], pinning: Pinning, args: argparse.Namespace
) -> str:
    cores = os.cpu_count()
    lines = [
        f"machine: {cores} CPUs ({platform.machine()}); {pinning.describe()}",
        f"fake engines: {args.engines} in one process (uvloop + httptools), streams of "
        f"{args.stream_chunks} chunks {args.chunk_interval_ms:g} ms apart",
        f"rounds: {args.rounds}; open loop {args.seconds:g} s per phase (+{LEAD_IN:g} s lead-in); "
        f"closed loop {args.max_seconds:g} s; python {platform.python_version()}, "
        f"aiohttp {installed_version('aiohttp')} client on uvloop; {oha_version()}",
    ]
    lines += [f"{t.name}: {t.url} {t.version}" for t in targets if t.name != "direct"]
    lines += [f"{name}: n/a: {reason}" for name, reason in absent.items()]
    return "\n".join(lines)


def oha_version() -> str:
    if not OHA.exists():
        return "oha missing"
    done = subprocess.run([str(OHA), "--version"], capture_output=True, text=True, check=False)
    return done.stdout.strip()


def run_round(
    index: int, targets: list[Target], args: argparse.Namespace, pinning: Pinning, ledger: Ledger
) -> dict[str, dict[str, Measured]]:
    shift = index % len(targets)
    order = targets[shift:] + targets[:shift]
    chat = encode({"model": MODEL, "messages": MESSAGES, "max_tokens": 8})
    streamed = encode({"model": MODEL, "messages": MESSAGES, "stream": True})
    prompt = encode({"model": MODEL, "prompt": prompt_ids(args.prompt_tokens), "max_tokens": 1})
    if index == 0:
        for target in targets:  # connections, caches, the first requests' imports
            asyncio_run(one_at_a_time(request(target, CHAT, chat), 200, warm=0))
            asyncio_run(one_at_a_time(request(target, "/v1/completions", prompt), 2, warm=0))
    phases: dict[str, dict[str, Measured]] = {}

    def measure(phase: str, work: Callable[[Target], tuple[Measured, int]]) -> None:
        phases[phase] = {}
        for target in order:
            phases[phase][target.name] = observe(target, phase, work, ledger, pinning.gateway)
            print(f"  round {index + 1}: {phase} {target.name} done", file=sys.stderr, flush=True)

    for rate in args.rates:
        schedule = arrivals(rate, args.seconds, seed=index * 7919 + int(rate))
        measure(f"{rate:g} req/s", partial(plain, body=chat, schedule=schedule))
    schedule = arrivals(args.stream_rate, args.seconds, seed=index * 7919 + 1)
    measure(f"{args.stream_rate:g} streams/s", lambda t: streams(t, streamed, schedule))
    if OHA.exists():
        client = pinning.prefix(pinning.client)
        seconds, connections = args.max_seconds, args.connections
        measure("closed loop", lambda t: saturate(t, chat, connections, seconds, client))
    repeats = args.prompt_repeats
    measure(f"{args.prompt_tokens} tokens", lambda t: long_prompt(t, prompt, repeats))
    return phases


def observe(
    target: Target,
    phase: str,
    work: Callable[[Target], tuple[Measured, int]],
    ledger: Ledger,
    core: int | None,
) -> Measured:
    """Run one phase against one target; add its process's CPU per request and core share, and
    the share of the proxy `core` that anything else used meanwhile (other proxies idling,
    other people's processes: noise); then wait for the target to go idle."""
    before = gc_histogram(target)
    cpu = process_cpu_seconds(target.pid) if target.pid else 0.0
    core_before = core_busy_seconds(core) if core is not None else 0.0
    start = time.monotonic()
    measured, requests = work(target)
    end = time.monotonic()
    used = process_cpu_seconds(target.pid) - cpu if target.pid else 0.0
    if target.pid:
        measured.values["cpu"] = used / max(requests, 1)
        measured.values["busy"] = used / (end - start)
    if core is not None:
        others = core_busy_seconds(core) - core_before - used
        measured.values["others"] = max(others, 0.0) / (end - start)
    if target.gc_file:
        ledger.windows.append((target.name, phase, start, end))
        after = gc_histogram(target)
        if before is not None and after is not None:
            grown = {le: after[le] - before.get(le, 0.0) for le in after}
            ledger.histograms.setdefault(phase, {}).setdefault(target.name, []).append(grown)
    if target.pid:
        settle(target.pid)
    return measured


def plain(target: Target, body: bytes, schedule: list[float]) -> tuple[Measured, int]:
    result = asyncio_run(open_loop(request(target, CHAT, body), schedule, stream=False))
    return latency_figures(result), result.sent


def streams(target: Target, body: bytes, schedule: list[float]) -> tuple[Measured, int]:
    result = asyncio_run(open_loop(request(target, CHAT, body), schedule, stream=True))
    measured = latency_figures(result)
    measured.values["ttft50"] = quantile(result.first_bytes, 0.5)
    measured.values["ttft99"] = quantile(result.first_bytes, 0.99)
    return measured, result.sent


def latency_figures(result: OpenLoop) -> Measured:
    failed = result.errors + result.dropped
    return Measured(
        {
            "p50": quantile(result.latencies, 0.5),
            "p99": quantile(result.latencies, 0.99),
            "failed": failed,
        },
        trouble=failed > TROUBLE_SHARE * max(result.counted, 1),
    )


def saturate(
    target: Target, body: bytes, connections: int, seconds: float, pin: list[str]
) -> tuple[Measured, int]:
    result: ClosedLoop = closed_loop(OHA, request(target, CHAT, body), connections, seconds, pin)
    figures = {"rps": result.requests_per_second, "p50": result.p50, "p99": result.p99}
    trouble = result.failed > TROUBLE_SHARE * max(result.ok + result.failed, 1)
    return Measured({**figures, "failed": result.failed}, trouble), result.ok + result.failed


def long_prompt(target: Target, body: bytes, repeats: int) -> tuple[Measured, int]:
    latencies, errors = asyncio_run(
        one_at_a_time(request(target, "/v1/completions", body), repeats)
    )
    median = statistics.median(latencies) if latencies else float("nan")
    measured = Measured({"median": median, "failed": errors}, trouble=errors > 0)
    return measured, repeats + 2


def encode(body: dict[str, object]) -> bytes:
    """A request body as compact JSON, the way clients send it."""
    return json.dumps(body, separators=(",", ":")).encode()


def prompt_ids(tokens: int) -> list[int]:
    """Token ids as a tokenizer would give them (spread over a 32k vocabulary)."""
    return [(i * 7919) % 32000 + 100 for i in range(tokens)]


def request(target: Target, path: str, body: bytes) -> Request:
    headers = {"content-type": "application/json", **target.headers}
    return Request(target.url + path, body, headers)


def asyncio_run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a load coroutine on uvloop (the client's own cost stays small)."""
    return uvloop.run(coroutine)


def gc_histogram(target: Target) -> dict[float, float] | None:
    """The gateway's `llmfleet_gateway_gc_pause_seconds` buckets {le: count}, summed over
    generations; None when it does not export it."""
    if not target.gc_file:
        return None
    buckets: dict[float, float] = {}
    for line in httpx.get(target.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(GC_METRIC):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            bound = float("inf") if le == "+Inf" else float(le)
            buckets[bound] = buckets.get(bound, 0.0) + float(line.rsplit(" ", 1)[1])
    return buckets or None


def overhead_mean(url: str) -> str:
    total = number = 0.0
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("llmfleet_gateway_overhead_seconds_sum"):
            total += float(line.rsplit(" ", 1)[1])
        elif line.startswith("llmfleet_gateway_overhead_seconds_count"):
            number += float(line.rsplit(" ", 1)[1])
    return f"{total / number * 1000:.3f} ms over {number:.0f} requests" if number else "no samples"


def profile(targets: list[Target], pinning: Pinning, args: argparse.Namespace) -> None:
    """py-spy on each llmfleet gateway in turn under `--profile-rate` req/s open-loop load."""
    if not PY_SPY.exists():
        raise SystemExit(f"{PY_SPY} missing: run `make bench-peers`")
    args.profile.mkdir(parents=True, exist_ok=True)
    body = encode({"model": MODEL, "messages": MESSAGES, "max_tokens": 8})
    pin = pinning.prefix(pinning.client)
    for target in targets:
        if not target.pid:
            continue
        asyncio_run(one_at_a_time(request(target, CHAT, body), 200, warm=0))
        schedule = arrivals(args.profile_rate, 2 * args.profile_seconds + 2, seed=1)

        result, files = asyncio_run(load_and_record(target, schedule, body, args, pin))
        p50, p99 = quantile(result.latencies, 0.5), quantile(result.latencies, 0.99)
        failed = result.errors + result.dropped
        print(f"{target.name} ({target.version}) at {args.profile_rate:g} req/s under py-spy: "
              f"p50 {ms(p50)}, p99 {ms(p99)}, failed or dropped {failed}")  # fmt: skip
        for path in files:
            print(f"  wrote {path}")
        print(files[-1].read_text())


async def load_and_record(
    target: Target, schedule: list[float], body: bytes, args: argparse.Namespace, pin: list[str]
) -> tuple[OpenLoop, list[Path]]:
    """The open loop, and py-spy (twice, one after the other) once the lead-in is over."""
    assert target.pid is not None
    loading = asyncio.create_task(open_loop(request(target, CHAT, body), schedule, stream=False))
    await asyncio.sleep(LEAD_IN + 1)
    files = await record(
        PY_SPY, target.pid, args.profile, target.name, seconds=args.profile_seconds, pin=pin
    )
    return await loading, files


if __name__ == "__main__":
    main()
