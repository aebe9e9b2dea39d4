"""Benchmark: rage clicks among normal traffic, with coalescing and debouncing off and on.

A public trace's arrival times (default: the Azure 2023 code trace, bursty; `--rate` x
`--seconds` of its arrivals from `--trace-start`, time-scaled to span `--seconds`) are replayed
open-loop against one gateway process (`llmfleet gateway --static-config`, on CPU 0 when
`taskset` exists). It serves four models, one per configuration, each with its own
llm-d-inference-sim engine, so the engines count each configuration's upstream requests apart:

    off        no traffic policy
    coalesce   traffic.coalesce {enabled: true}
    debounce   traffic.debounce {mode: LatestWins, windowMs: --window-ms, delayMs: --delay-ms}
    both       the two together

Assumptions (all flags, so the figures are not tied to one trace):
- normal traffic: every arrival of the trace is one request of one of `--users` users (picked at
  random, each with its own `x-session-id`); prompt and output lengths are the trace's, capped
  (`--max-prompt-tokens`, `--max-output-tokens`); the engine generates exactly that many tokens;
- rage clicks: a share `--rage-share` of the arrivals is instead a burst from one of
  `--rage-users` users: `--burst-min`..`--burst-max` identical requests (same body, same
  `x-session-id`) `--gap-ms` apart (uniform in the range); a rage user starts its next burst
  `--rage-pause` seconds after its last click at the earliest (while none is free, the arrival
  stays normal traffic);
- engines: `--engine-seqs` concurrent requests each (more wait), `--ttft-ms` to the first token,
  `--itl-ms` per token, slower by up to `--load-factor` when full. The simulator finishes a
  request whose client left (vLLM aborts it), so the engine work that debouncing's upstream
  cancellation saves is understated; requests that reached an engine are counted either way.

Each round replays the same requests once per configuration (order rotated between rounds,
engines drained in between); figures are medians over `--rounds`. Latency is of answered
requests (status 200); a burst's time to answer runs from its first click to its first answer.
409s are superseded requests (a normal user's second request within the window is one too).
Debouncing is the outer stage: with both on, duplicates are superseded before coalescing sees
them.

    python bench/rage_click.py [--quick] [--rate 20] [--seconds 30] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from _support import free_port, pinned, wait_ready

from llmfleet.autoscaler.sim import traces
from llmfleet.core.cluster import build
from llmfleet.core.cluster.toolchain import TOOLS_BY_NAME

ROOT = Path(__file__).resolve().parent.parent
TRACE_DIRS = (ROOT.parent / "shared" / "data" / "traces", ROOT / "data" / "traces")
CONFIGS = ("off", "coalesce", "debounce", "both")


@dataclass(frozen=True)
class Send:
    """One request of the plan: when, what, from whom."""

    at: float
    session: str
    content: str
    max_tokens: int
    burst: int | None
    """The rage burst it belongs to (None: normal traffic)."""


@dataclass
class Outcome:
    send: Send
    sent: float
    """When it was really sent (seconds from the start; the plan says `send.at`)."""
    status: int
    latency: float
    superseded: bool
    error: str = ""
    """What went wrong, for statuses other than 200 and 409 (a sample is printed)."""


@dataclass
class Figures:
    upstream: int
    outcomes: list[Outcome]
    policy: dict[str, float] = field(default_factory=dict)


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def default_trace() -> Path:
    for folder in TRACE_DIRS:
        if (folder / "azure2023_code.csv").is_file():
            return folder / "azure2023_code.csv"
    raise SystemExit("no trace found: pass --trace FILE (.csv Azure or .jsonl Mooncake)")


def plan(trace: traces.Trace, args: argparse.Namespace) -> list[Send]:
    """The requests to send, pure and seeded: the `--rate` x `--seconds` arrivals of the trace
    from `--trace-start`, time-scaled to span `--seconds` (the trace's own bursts kept), a
    `--rage-share` of them turned into bursts of identical requests."""
    rng = random.Random(args.seed)
    arrivals = [r for r in trace.requests if r.arrival >= args.trace_start]
    arrivals = arrivals[: max(2, round(args.rate * args.seconds))]
    if len(arrivals) < 2:
        raise SystemExit(f"the trace has fewer than 2 requests after {args.trace_start} s")
    first, span = arrivals[0].arrival, arrivals[-1].arrival - arrivals[0].arrival
    scale = args.seconds / span if span > 0 else 0.0
    sends: list[Send] = []
    bursts = 0
    free_at: dict[int, float] = {}  # when each rage user may start its next burst
    for n, request in enumerate(arrivals):
        at = (request.arrival - first) * scale
        words = min(request.prompt_tokens, args.max_prompt_tokens)
        content = f"request {n}: " + " ".join(["lorem"] * max(words - 2, 1))
        max_tokens = max(1, min(request.output_tokens, args.max_output_tokens))
        rage = rng.random() < args.rage_share
        free = [u for u in range(args.rage_users) if at >= free_at.get(u, 0.0)]
        if not rage or not free:
            sends.append(Send(at, f"user-{rng.randrange(args.users)}", content, max_tokens, None))
            continue
        user = rng.choice(free)
        low, high = args.gap_ms
        for click in range(rng.randint(args.burst_min, args.burst_max)):
            if click:
                at += rng.uniform(low, high) / 1000
            sends.append(Send(at, f"rage-{user}", content, max_tokens, bursts))
        free_at[user] = at + args.rage_pause
        bursts += 1
    return sorted(sends, key=lambda s: s.at)


def static_config(engines: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    coalesce = {"enabled": True}
    debounce = {"mode": "LatestWins", "windowMs": args.window_ms, "delayMs": args.delay_ms}
    traffic: dict[str, dict[str, Any]] = {
        "off": {},
        "coalesce": {"coalesce": coalesce},
        "debounce": {"debounce": debounce},
        "both": {"coalesce": coalesce, "debounce": debounce},
    }
    return {
        "models": {
            config: {"service": config, "unified": [url], "traffic": traffic[config]}
            for config, url in engines.items()
        }
    }


def metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for found, value in re.findall(rf"^{re.escape(name)}\{{([^}}]*)\}} (\S+)$", text, re.M):
        if all(f'{key}="{want}"' in found for key, want in labels.items()):
            total += float(value)
    return total


def engine_requests(url: str, timeout: float = 120) -> int:
    """Requests the engine has received (it finishes them all), once it is idle again."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = httpx.get(url + "/metrics", timeout=5).text
        busy = metric(text, "vllm:num_requests_running") + metric(text, "vllm:num_requests_waiting")
        if busy == 0:
            return int(metric(text, "vllm:e2e_request_latency_seconds_count"))
        time.sleep(0.2)
    raise SystemExit(f"the engine at {url} did not drain in {timeout}s")


def policy_counts(gateway: str, config: str) -> dict[str, float]:
    text = httpx.get(gateway + "/metrics", timeout=5).text
    return {
        "coalesced": metric(text, "llmfleet_gateway_coalesced_total", model=config),
        "superseded held": metric(
            text, "llmfleet_gateway_superseded_total", model=config, when="held"
        ),
        "superseded dispatched": metric(
            text, "llmfleet_gateway_superseded_total", model=config, when="dispatched"
        ),
    }


async def replay(gateway: str, config: str, sends: list[Send], stream: bool) -> list[Outcome]:
    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=256)
    outcomes: list[Outcome] = []
    async with httpx.AsyncClient(base_url=gateway, limits=limits, timeout=120) as client:

        async def one(send: Send) -> None:
            body = {
                "model": config,
                "messages": [{"role": "user", "content": send.content}],
                "max_tokens": send.max_tokens,
                "ignore_eos": True,
                "stream": stream,
            }
            start = time.perf_counter()
            sent = start - begin
            try:
                response = await client.post(
                    "/v1/chat/completions", json=body, headers={"x-session-id": send.session}
                )
                status, text = response.status_code, response.text
            except httpx.HTTPError as error:
                status, text = 0, f"{type(error).__name__}: {error}"
            latency = time.perf_counter() - start
            superseded = status == 409 or '"superseded"' in text[-400:]
            if superseded:
                status = 409
            error = "" if status in {200, 409} else f"{status} {text[:200]}"
            outcomes.append(Outcome(send, sent, status, latency, superseded, error))

        tasks = []
        begin = time.perf_counter()
        for send in sends:
            delay = begin + send.at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(send)))
        await asyncio.gather(*tasks)
    return outcomes


def summary(figures: Figures) -> dict[str, float]:
    answered = [o for o in figures.outcomes if o.status == 200]
    normal = [o.latency for o in answered if o.send.burst is None]
    first_click: dict[int, float] = {}
    answer: dict[int, float] = {}
    for o in figures.outcomes:
        if o.send.burst is None:
            continue
        first_click[o.send.burst] = min(first_click.get(o.send.burst, o.sent), o.sent)
        if o.status == 200:
            done = o.sent + o.latency
            answer[o.send.burst] = min(answer.get(o.send.burst, done), done)
    to_answer = [answer[b] - first_click[b] for b in answer]
    everyone = [o.latency for o in answered]
    return {
        "requests sent": len(figures.outcomes),
        "upstream requests": figures.upstream,
        "latency p50 ms": quantile(everyone, 0.5) * 1000,
        "latency p99 ms": quantile(everyone, 0.99) * 1000,
        "normal p50 ms": quantile(normal, 0.5) * 1000,
        "normal p99 ms": quantile(normal, 0.99) * 1000,
        "burst to answer p50 ms": quantile(to_answer, 0.5) * 1000,
        "burst to answer p99 ms": quantile(to_answer, 0.99) * 1000,
        "bursts unanswered": len(first_click) - len(answer),
        "409 normal": sum(o.superseded and o.send.burst is None for o in figures.outcomes),
        "409 rage": sum(o.superseded and o.send.burst is not None for o in figures.outcomes),
        "other errors": sum(o.status not in {200, 409} for o in figures.outcomes),
        **figures.policy,
    }


def report(rounds: list[dict[str, dict[str, float]]]) -> None:
    rows = list(rounds[0]["off"])
    medians = {c: {r: statistics.median(x[c][r] for x in rounds) for r in rows} for c in CONFIGS}
    print(f"\nmedians of {len(rounds)} round(s)")
    print(f"  {'':<26}" + "".join(f"{c:>11}" for c in CONFIGS))
    for name in rows:
        values = "".join(f"{medians[c][name]:>11.1f}" for c in CONFIGS)
        print(f"  {name:<26}{values}")
    off = medians["off"]["upstream requests"]
    saved = "".join(
        f"{(off - medians[c]['upstream requests']) / off * 100:>10.1f}%" if off else f"{'-':>11}"
        for c in CONFIGS
    )
    print(f"  {'upstream saved vs off':<26}{saved}")


@contextmanager
def processes(commands: list[list[str]]) -> Iterator[None]:
    started = [
        subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for command in commands
    ]
    try:
        yield
    finally:
        for process in started:
            process.terminate()
        for process in started:
            process.wait(timeout=10)


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=None, help="default: Azure 2023 code")
    parser.add_argument("--trace-start", type=float, default=0.0, help="seconds into the trace")
    parser.add_argument("--rate", type=float, default=20.0, help="mean trace arrivals a second")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--rage-users", type=int, default=5)
    parser.add_argument("--rage-share", type=float, default=0.1)
    parser.add_argument("--rage-pause", type=float, default=1.0, help="seconds between bursts")
    parser.add_argument("--burst-min", type=int, default=2)
    parser.add_argument("--burst-max", type=int, default=5)
    parser.add_argument("--gap-ms", type=float, nargs=2, default=(20.0, 80.0), metavar=("LO", "HI"))
    parser.add_argument("--window-ms", type=int, default=300)
    parser.add_argument("--delay-ms", type=int, default=100)
    parser.add_argument("--max-prompt-tokens", type=int, default=1024)
    parser.add_argument("--max-output-tokens", type=int, default=64)
    parser.add_argument("--engine-seqs", type=int, default=48)
    parser.add_argument("--ttft-ms", type=int, default=50)
    parser.add_argument("--itl-ms", type=int, default=10)
    parser.add_argument("--load-factor", type=float, default=2.0)
    parser.add_argument("--stream", action="store_true", help="streaming requests")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--quick", action="store_true", help="CI size: 8 s, one round")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.rounds = 8.0, 1
    return args


def main() -> None:
    args = arguments()

    trace = traces.load(args.trace or default_trace())
    sends = plan(trace, args)
    bursts = {s.burst for s in sends if s.burst is not None}
    arrivals = sum(s.burst is None for s in sends) + len(bursts)
    print(
        f"trace {trace.name} from {args.trace_start:.0f} s, scaled to {args.rate:g} req/s for "
        f"{args.seconds:g} s: {len(sends)} requests; {len(bursts)} of the {arrivals} arrivals "
        f"are rage bursts (asked: {args.rage_share:.0%}) of {args.burst_min}-{args.burst_max} "
        f"identical requests {args.gap_ms[0]:g}-{args.gap_ms[1]:g} ms apart from "
        f"{args.rage_users} users, each {args.rage_pause:g} s between bursts at least; normal "
        f"traffic from {args.users} users"
    )
    print(
        f"engines: llm-d-inference-sim, {args.engine_seqs} seqs, TTFT {args.ttft_ms} ms, "
        f"ITL {args.itl_ms} ms, x{args.load_factor:g} under load; debounce windowMs "
        f"{args.window_ms} delayMs {args.delay_ms}; {'streaming' if args.stream else 'JSON'}"
    )
    tool = TOOLS_BY_NAME["llm-d-inference-sim"]
    build.ensure_tools([tool])
    binary = str(build.binary(tool, "llm-d-inference-sim"))
    engines = {config: f"http://127.0.0.1:{free_port()}" for config in CONFIGS}
    flags = ["--force-dummy-tokenizer", "--mode", "random", "--max-model-len", "65536"]
    flags += ["--max-num-seqs", str(args.engine_seqs), "--time-to-first-token", f"{args.ttft_ms}ms"]
    flags += ["--inter-token-latency", f"{args.itl_ms}ms"]
    flags += ["--time-factor-under-load", str(args.load_factor)]
    sim_commands = [
        pinned(1, [binary, "--port", url.rsplit(":", 1)[1], "--model", config, *flags])
        for config, url in engines.items()
    ]
    gateway = f"http://127.0.0.1:{free_port()}"
    with tempfile.TemporaryDirectory() as tmp:
        config_file = Path(tmp) / "fleet.yaml"
        config_file.write_text(yaml.safe_dump(static_config(engines, args)))
        gw_command = [str(Path(sys.executable).parent / "llmfleet"), "gateway"]
        gw_command += ["--static-config", str(config_file), "--host", "127.0.0.1"]
        gw_command += ["--port", gateway.rsplit(":", 1)[1]]
        with processes([*sim_commands, pinned(0, gw_command)]):
            for url in engines.values():
                wait_ready(url + "/health/ready")
            wait_ready(gateway + "/readyz")
            report(run(gateway, engines, sends, args))


def run(
    gateway: str, engines: dict[str, str], sends: list[Send], args: argparse.Namespace
) -> list[dict[str, dict[str, float]]]:
    warmup = [Send(i * 0.01, f"warm-{i}", "warm up", 4, None) for i in range(20)]
    for config in CONFIGS:
        asyncio.run(replay(gateway, config, warmup, args.stream))
    rounds: list[dict[str, dict[str, float]]] = []
    for number in range(args.rounds):
        order = CONFIGS[number % len(CONFIGS) :] + CONFIGS[: number % len(CONFIGS)]
        results: dict[str, dict[str, float]] = {}
        for config in order:
            engine = engines[config]
            before_engine = engine_requests(engine)
            before_policy = policy_counts(gateway, config)
            started = time.perf_counter()
            outcomes = asyncio.run(replay(gateway, config, sends, args.stream))
            upstream = engine_requests(engine) - before_engine
            after_policy = policy_counts(gateway, config)
            policy = {k: after_policy[k] - before_policy[k] for k in after_policy}
            results[config] = summary(Figures(upstream, outcomes, policy))
            row = results[config]
            took = time.perf_counter() - started
            print(
                f"round {number + 1}/{args.rounds} {config:<9} {took:5.1f} s:"
                f" {row['requests sent']:.0f} sent, {upstream} upstream, p99 "
                f"{row['latency p99 ms']:.0f} ms, 409s {row['409 normal'] + row['409 rage']:.0f},"
                f" other errors {row['other errors']:.0f}",
                flush=True,
            )
            for error in sorted({o.error for o in outcomes if o.error})[:3]:
                print(f"    error: {error}", flush=True)
        rounds.append(results)
    return rounds


if __name__ == "__main__":
    main()
