"""Benchmark: model cascading on replayed arrivals, side by side with a large-model-only fleet.

Everything runs on 127.0.0.1: two stand-in engines (this script with `--engine`, one process
each), a cheap one and a large one, and the gateway (`llmfleet gateway --static-config`) with
three models: `cheap` (the cheap engine), `large` (the large engine) and `assistant` (the large
engine, cascading to `cheap` first). Both phases replay the same requests in the same run:

(a) large-only: every request to `large`;
(b) cascade:    every request to `assistant` (cheap tier first; escalated when unsure).

Workload: `--seconds` of a public trace from `--start` (default: the Azure 2023 code trace,
`TIMESTAMP,ContextTokens,GeneratedTokens`; a Mooncake `.jsonl` works too), arrivals divided by
`--speed`. Each request is a chat request whose prompt has ContextTokens * 4 characters (the
gateway's estimate, 4 characters a token, gives the trace's count back) and `max_tokens` =
GeneratedTokens; `--hard-share` of the prompts contain "explain" (a hard keyword: they skip the
cheap tier, or are hedged with `--hedge`). Prompts over `--cheap-max-prompt` tokens skip it too.

Engines (a stated model, not a GPU; unlimited concurrency, so no queueing): a request takes
prompt tokens * `--large-prefill-ms-per-1k` / 1000 + output tokens * `--large-tpot-ms`; the
cheap engine is `--cheap-speedup` times faster. A cheap answer is confident with probability
`--confident-share`, drawn per request from a seeded RNG: every token has probability 0.9 when
confident, 0.4 when not; the tier escalates below 0.7 (MeanProbability).

GPU-seconds = engine busy time * relative GPU cost of the tier (large 1, cheap `--cheap-cost`),
where busy time is the sum over requests of the time each spent in the engine (until its last
byte, or until its client left: a cancelled hedge loser stops counting). Latency is the
client's, end to end (non-streaming); p50 is the median.

    python bench/cascade_replay.py [--quick] [--seconds 120] [--confident-share 0.6] [--hedge]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from _support import free_port, wait_ready
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from llmfleet.autoscaler.sim.traces import load

ROOT = Path(__file__).resolve().parents[1]
CONFIDENT_P, UNSURE_P, THRESHOLD = 0.9, 0.4, 0.7


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# --- the stand-in engine (`--engine`) -----------------------------------------------------------


def engine_app(
    tpot: float, prefill_per_token: float, confident_share: float, seed: int
) -> Starlette:
    """A chat engine that takes the modelled time, answers `max_tokens` tokens with logprobs
    when asked, and counts its busy time (GET /stats)."""
    stats = {"busy_seconds": 0.0, "requests": 0, "cancelled": 0}

    async def chat(request: Request) -> Response:
        started = time.perf_counter()
        body = json.loads(await request.body())
        text = str(body["messages"][-1]["content"])
        tokens = int(body.get("max_tokens") or 16)
        stats["requests"] += 1
        try:
            left = await _client_leaves_within(
                request, len(text) // 4 * prefill_per_token + tokens * tpot
            )
        finally:
            stats["busy_seconds"] += time.perf_counter() - started
        if left:
            stats["cancelled"] += 1
            return Response(status_code=499)
        draw = random.Random(zlib.crc32(text.encode()) ^ seed).random()
        logprob = math.log(CONFIDENT_P if draw < confident_share else UNSURE_P)
        words = [f"w{i} " for i in range(tokens)]
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": "".join(words)},
            "finish_reason": "length",
            "logprobs": None,
        }
        if body.get("logprobs"):
            choice["logprobs"] = {
                "content": [{"token": w, "logprob": logprob, "top_logprobs": []} for w in words]
            }
        usage = {"prompt_tokens": len(text) // 4, "completion_tokens": tokens}
        return JSONResponse(
            {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [choice],
                "usage": usage,
            }
        )

    async def read_stats(_: Request) -> Response:
        return JSONResponse(stats)

    async def health(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/stats", read_stats),
            Route("/health", health),
        ]
    )


async def _client_leaves_within(request: Request, seconds: float) -> bool:
    deadline = time.perf_counter() + seconds
    while (left := deadline - time.perf_counter()) > 0:
        if await request.is_disconnected():
            return True
        await asyncio.sleep(min(0.05, left))
    return False


def serve_engine(args: argparse.Namespace) -> None:
    app = engine_app(args.tpot_ms / 1000, args.prefill_ms_per_1k / 1e6, args.share, args.seed)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


# --- the replay -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Arrival:
    at: float
    prompt_tokens: int
    output_tokens: int
    hard: bool


@dataclass
class Result:
    latency: float
    status: int
    tier: str
    escalated: bool


def arrivals(args: argparse.Namespace) -> list[Arrival]:
    trace = load(Path(args.trace))
    rng = random.Random(args.seed)
    window = [r for r in trace.requests if args.start <= r.arrival < args.start + args.seconds]
    return [
        Arrival(
            (r.arrival - args.start) / args.speed,
            r.prompt_tokens,
            max(1, r.output_tokens),
            rng.random() < args.hard_share,
        )
        for r in window
    ]


def body(model: str, index: int, arrival: Arrival) -> dict[str, Any]:
    head = f"request {index}: " + ("please explain " if arrival.hard else "complete ")
    filler = "abcd" * max(0, arrival.prompt_tokens - len(head) // 4)
    return {
        "model": model,
        "messages": [{"role": "user", "content": head + filler}],
        "max_tokens": arrival.output_tokens,
    }


async def replay(
    url: str, model: str, requests: list[Arrival], progress: Callable[[str], None]
) -> list[Result]:
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=256)
    results: list[Result] = []
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=600) as client:

        async def one(index: int, arrival: Arrival) -> None:
            started = time.perf_counter()
            try:
                response = await client.post(
                    "/v1/chat/completions", json=body(model, index, arrival)
                )
                status = response.status_code
                headers = response.headers
            except httpx.HTTPError:
                status, headers = 0, httpx.Headers()
            results.append(
                Result(
                    time.perf_counter() - started,
                    status,
                    headers.get("x-llmfleet-tier", model),
                    headers.get("x-llmfleet-escalated") == "true",
                )
            )

        begin = time.perf_counter()
        tasks = []
        next_report = 10.0
        for index, arrival in enumerate(requests):
            delay = begin + arrival.at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(index, arrival)))
            if arrival.at >= next_report:
                progress(f"{arrival.at:.0f} s: {len(tasks)} sent, {len(results)} answered")
                next_report = (arrival.at // 10 + 1) * 10
        await asyncio.gather(*tasks)
    return results


def _by_cheap(result: Result) -> bool:
    return result.tier == "cheap"


def _escalated(result: Result) -> bool:
    return result.escalated


def _large_only(result: Result) -> bool:
    return result.tier != "cheap" and not result.escalated


PATHS: tuple[tuple[str, Callable[[Result], bool]], ...] = (
    ("served by the cheap tier", _by_cheap),
    ("escalated (cheap answer discarded)", _escalated),
    ("large, cheap tier skipped or not asked", _large_only),
)
"""How a request was served (in large-only, every request is the last kind)."""


def engine_stats(url: str) -> dict[str, float]:
    stats: dict[str, float] = httpx.get(url + "/stats", timeout=5).json()
    return stats


def measure(
    gateway: str, engines: dict[str, str], model: str, requests: list[Arrival]
) -> tuple[list[Result], dict[str, dict[str, float]]]:
    before = {name: engine_stats(url) for name, url in engines.items()}
    results = asyncio.run(
        replay(gateway, model, requests, lambda line: print(f"  [{model}] {line}", flush=True))
    )
    after = {name: engine_stats(url) for name, url in engines.items()}
    spent = {
        name: {key: after[name][key] - before[name][key] for key in after[name]} for name in engines
    }
    return results, spent


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="30 s of trace instead of --seconds")
    parser.add_argument("--trace", default=str(ROOT / "data/traces/azure2023_code.csv"))
    parser.add_argument("--start", type=float, default=180, help="trace second to start at")
    parser.add_argument("--seconds", type=float, default=120, help="trace seconds to replay")
    parser.add_argument("--speed", type=float, default=1.0, help="arrivals this much faster")
    parser.add_argument("--confident-share", type=float, default=0.6)
    parser.add_argument("--hard-share", type=float, default=0.1)
    parser.add_argument("--hedge", action="store_true", help="hedge hard requests")
    parser.add_argument("--cheap-max-prompt", type=int, default=4096, help="tokens")
    parser.add_argument("--large-tpot-ms", type=float, default=30.0)
    parser.add_argument("--large-prefill-ms-per-1k", type=float, default=100.0)
    parser.add_argument("--cheap-speedup", type=float, default=3.0)
    parser.add_argument("--cheap-cost", type=float, default=0.25, help="GPU cost vs large = 1")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--engine", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--tpot-ms", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--prefill-ms-per-1k", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--share", type=float, help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.engine:
        serve_engine(args)
        return
    if args.quick:
        args.seconds = 30.0
    requests = arrivals(args)
    if not requests:
        raise SystemExit("no request in that window of the trace")
    ports = {"cheap": free_port(), "large": free_port(), "gateway": free_port()}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    speed = {"cheap": args.cheap_speedup, "large": 1.0}
    processes = []
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "fleet.yaml"
        config.write_text(fleet_yaml(urls, args))
        for name in ("cheap", "large"):
            command = [sys.executable, __file__, "--engine", "--port", str(ports[name])]
            command += ["--tpot-ms", str(args.large_tpot_ms / speed[name])]
            command += ["--prefill-ms-per-1k", str(args.large_prefill_ms_per_1k / speed[name])]
            command += ["--share", str(args.confident_share), "--seed", str(args.seed)]
            processes.append(subprocess.Popen(command))
        gateway = [str(Path(sys.executable).parent / "llmfleet"), "gateway", "--static-config"]
        gateway += [str(config), "--host", "127.0.0.1", "--port", str(ports["gateway"])]
        processes.append(
            subprocess.Popen(gateway, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        )
        try:
            for name in ("cheap", "large"):
                wait_ready(urls[name] + "/health")
            wait_ready(urls["gateway"] + "/readyz")
            run(urls, requests, args)
        finally:
            for process in processes:
                process.terminate()
                process.wait(timeout=10)


def fleet_yaml(urls: dict[str, str], args: argparse.Namespace) -> str:
    tier = {
        "service": "cheap",
        "escalateBelowConfidence": THRESHOLD,
        "maxPromptTokens": args.cheap_max_prompt,
    }
    cascade = {"tiers": [tier], "confidence": "MeanProbability", "hedge": args.hedge}
    models = {
        "cheap": {"unified": [urls["cheap"]]},
        "large": {"unified": [urls["large"]]},
        "assistant": {"unified": [urls["large"]], "traffic": {"cascade": cascade}},
    }
    return json.dumps({"models": models})  # JSON is YAML


def run(urls: dict[str, str], requests: list[Arrival], args: argparse.Namespace) -> None:
    span = requests[-1].at
    print(
        f"{len(requests)} requests over {span:.0f} s ({Path(args.trace).name} from "
        f"{args.start:.0f} s, speed {args.speed:g}); mean prompt "
        f"{statistics.mean(r.prompt_tokens for r in requests):.0f} tokens, mean output "
        f"{statistics.mean(r.output_tokens for r in requests):.0f} tokens",
        flush=True,
    )
    print(
        f"cheap tier: {args.confident_share:.0%} of answers confident, "
        f"{args.cheap_speedup:g}x faster, GPU cost {args.cheap_cost:g} of large; "
        f"hard share {args.hard_share:.0%}, hedge {'on' if args.hedge else 'off'}, "
        f"max prompt {args.cheap_max_prompt} tokens",
        flush=True,
    )
    engines = {"cheap": urls["cheap"], "large": urls["large"]}
    phases = {}
    for name, model in (("large-only", "large"), ("cascade", "assistant")):
        print(f"{name}: replaying ...", flush=True)
        phases[name] = measure(urls["gateway"], engines, model, requests)
    report(phases, args)


def report(
    phases: dict[str, tuple[list[Result], dict[str, dict[str, float]]]],
    args: argparse.Namespace,
) -> None:
    cost = {"cheap": args.cheap_cost, "large": 1.0}
    gpu = {
        name: sum(spent[e]["busy_seconds"] * cost[e] for e in spent)
        for name, (_, spent) in phases.items()
    }
    print(f"\n{'':<40} {'large-only':>12} {'cascade':>12}")

    def row(label: str, cells: list[str]) -> None:
        print(f"  {label:<38}" + "".join(f" {cell:>12}" for cell in cells))

    def share(results: list[Result], keep: Callable[[Result], bool]) -> str:
        return f"{sum(map(keep, results)) / len(results):.1%}"

    names = list(phases)
    results = {name: phases[name][0] for name in names}
    row("requests", [str(len(results[n])) for n in names])
    row("errors (status != 200)", [str(sum(r.status != 200 for r in results[n])) for n in names])
    for label, keep in PATHS:
        row(label, [share(results[n], keep) for n in names])
    for q, label in ((0.5, "latency p50"), (0.99, "latency p99")):
        cells = []
        for n in names:
            latencies = [r.latency for r in results[n] if r.status == 200]
            value = statistics.median(latencies) if q == 0.5 else quantile(latencies, q)
            cells.append(f"{value * 1000:.0f} ms")
        row(label, cells)
    for engine in ("large", "cheap"):
        row(
            f"engine busy, {engine} (s)",
            [f"{phases[n][1][engine]['busy_seconds']:.1f}" for n in names],
        )
    row(
        "hedge losers cancelled at the engines",
        [f"{sum(phases[n][1][e]['cancelled'] for e in ('cheap', 'large')):.0f}" for n in names],
    )
    row(f"GPU-seconds (large 1, cheap {args.cheap_cost:g})", [f"{gpu[n]:.1f}" for n in names])
    base = gpu["large-only"]
    saved = base - gpu["cascade"]
    row("GPU-seconds saved", ["-", f"{saved:.1f} ({saved / base:.0%})"])
    cascade = results["cascade"]
    print("  cascade latency p50 by path:")
    for label, keep in PATHS:
        latencies = [r.latency for r in cascade if keep(r) and r.status == 200]
        if latencies:
            print(
                f"    {label:<36} {statistics.median(latencies) * 1000:>10.0f} ms "
                f"({len(latencies)})"
            )


if __name__ == "__main__":
    main()
