"""Benchmark (issue 28): the gateway's CPU per engine scrape, by HTTP client.

At 300 services the gateway's scraper cost ~2.5 ms of CPU per scrape with httpx, more than a
proxied request (bench/results/issue28-control-plane-300x2-after.txt). This measures one scrape
as the scraper does it (GET /metrics, read the body, `scraper.engine_load`) with:
- `httpx`: `httpx.AsyncClient.get`, as the scraper did before (the baseline);
- `aiohttp`: `upstream.AiohttpUpstream.get`;
- `wire`: `wire.WireUpstream.get`, the gateway's own client, which the scraper uses now.

Two bodies: the stand-in engines' three gauges (bench/fake_engine.py's /metrics) and a body the
size of a vLLM engine's exposition (`--vllm-lines` lines of histogram buckets with vLLM's label
sets: 400 lines, ~49 KB, by default). The engine is a subprocess of this script (raw asyncio,
prebuilt answers, keep-alive), so only the client's CPU is this process's. Each cell: the
process's CPU time over `--scrapes` scrapes with `--concurrency` in flight on uvloop, per
scrape, the median of `--rounds`; every client runs in every round, in turn.

    llmfleet isolated -- python bench/scrape_cost.py [--scrapes 3000] [--concurrency 32] \\
        [--rounds 5] [--vllm-lines 400]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable

import httpx
import uvloop
from _support import free_port, pinned

from llmfleet.core import netns
from llmfleet.core.loopback import LoopbackGuard
from llmfleet.gateway.scraper import engine_load
from llmfleet.gateway.upstream import AiohttpUpstream, Upstream
from llmfleet.gateway.wire import WireUpstream

Scrape = Callable[[str], Awaitable[None]]

GAUGES = (
    'vllm:num_requests_running{model_name="m",engine="0"} 3\n'
    'vllm:num_requests_waiting{model_name="m",engine="0"} 1\n'
    'vllm:kv_cache_usage_perc{model_name="m",engine="0"} 0.25\n'
)


def vllm_sized(lines: int) -> str:
    """`lines` histogram bucket lines with vLLM's label sets, then the gauges (at the end, as
    vLLM's exposition puts them after its histograms)."""
    labels = 'engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"'
    out = []
    for i in range(lines):
        family = f"vllm:request_latency_family_{i // 25}_seconds_bucket"
        out.append(f'{family}{{{labels},le="{0.001 * 2 ** (i % 25):.3f}"}} {i * 17}.0')
    return "".join(line + "\n" for line in out) + GAUGES


def serve(port: int, body: bytes) -> None:
    """The engine: every request on a connection gets the same prebuilt 200 with `body`."""
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
    answer += b"Content-Length: %d\r\n\r\n%s" % (len(body), body)

    class Engine(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport
            self.buffer = b""

        def data_received(self, data: bytes) -> None:
            self.buffer += data
            while b"\r\n\r\n" in self.buffer:
                _, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
                self.transport.write(answer)  # type: ignore[attr-defined]

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Engine, "127.0.0.1", port, backlog=1024)
        print("ready", flush=True)
        await server.serve_forever()

    uvloop.run(main())


def httpx_scrape(client: httpx.AsyncClient) -> Scrape:
    async def scrape(url: str) -> None:
        response = await client.get(url)
        response.raise_for_status()
        engine_load(response.text)

    return scrape


def upstream_scrape(upstream: Upstream) -> Scrape:
    async def scrape(url: str) -> None:
        response = await upstream.get(url, 2.0)
        try:
            if response.status_code != 200:
                raise RuntimeError(f"status {response.status_code}")
            body = await response.aread()
        finally:
            await response.aclose()
        engine_load(body.decode("utf-8", "replace"))

    return scrape


async def cpu_per_scrape(scrape: Scrape, url: str, scrapes: int, concurrency: int) -> float:
    """CPU microseconds of this process per scrape, `scrapes` of them `concurrency` at a time."""
    left = scrapes

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await scrape(url)

    for _ in range(concurrency):  # warm: connections opened, URLs parsed
        await scrape(url)
    start = time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return (time.process_time() - start) / scrapes * 1e6


async def one_round(urls: dict[str, str], args: argparse.Namespace) -> dict[tuple[str, str], float]:
    guard = LoopbackGuard(True)
    limits = httpx.Limits(
        max_connections=args.concurrency, max_keepalive_connections=args.concurrency
    )
    found = {}
    async with httpx.AsyncClient(limits=limits, timeout=2.0) as client:
        clients: dict[str, tuple[Scrape, Callable[[], Awaitable[None]] | None]] = {
            "httpx (before)": (httpx_scrape(client), None),
        }
        aiohttp_upstream = AiohttpUpstream(guard, connect_timeout=2, name="scrape")
        wire_upstream = WireUpstream(guard, connect_timeout=2, name="scrape")
        clients["aiohttp"] = (upstream_scrape(aiohttp_upstream), aiohttp_upstream.aclose)
        clients["wire (now)"] = (upstream_scrape(wire_upstream), wire_upstream.aclose)
        for body, url in urls.items():
            for name, (scrape, _) in clients.items():
                found[(body, name)] = await cpu_per_scrape(
                    scrape, url, args.scrapes, args.concurrency
                )
        for _, close in clients.values():
            if close is not None:
                await close()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scrapes", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--vllm-lines", type=int, default=400)
    parser.add_argument("--serve", nargs=2, metavar=("PORT", "BODY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        port, body = args.serve
        serve(int(port), GAUGES.encode() if body == "gauges" else vllm_sized(int(body)).encode())
        return
    problem = netns.isolation_problem()
    if problem:
        raise SystemExit(f"scrape_cost: {problem}")
    bodies = {"gauges": "gauges", "vLLM-sized": str(args.vllm_lines)}
    engines, urls = [], {}
    for name, body in bodies.items():
        port = free_port()
        command = [sys.executable, __file__, "--serve", str(port), body]
        engine = subprocess.Popen(pinned(1, command), stdout=subprocess.PIPE, text=True)
        assert engine.stdout is not None
        if engine.stdout.readline().strip() != "ready":
            raise SystemExit(f"the {name} engine did not start")
        engines.append(engine)
        urls[name] = f"http://127.0.0.1:{port}/metrics"
    size = len(vllm_sized(args.vllm_lines).encode())
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    try:
        rounds = [uvloop.run(one_round(urls, args)) for _ in range(args.rounds)]
    finally:
        for engine in engines:
            engine.terminate()
    print(
        f"CPU per scrape [us], median of {args.rounds} rounds of {args.scrapes} scrapes, "
        f"{args.concurrency} in flight (GET, read, engine_load); vLLM-sized body {size} bytes"
    )
    names = list(dict.fromkeys(name for _, name in rounds[0]))
    print(f"{'body':<12}" + "".join(f"{name:>18}" for name in names) + f"{'httpx / wire':>16}")
    for body in bodies:
        cells = {name: statistics.median(r[(body, name)] for r in rounds) for name in names}
        row = "".join(f"{cells[name]:>18.0f}" for name in names)
        print(f"{body:<12}{row}{cells['httpx (before)'] / cells['wire (now)']:>15.1f}x")


if __name__ == "__main__":
    main()
