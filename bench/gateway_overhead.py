"""Benchmark: the latency the gateway adds, side by side with going to the engine directly.

One llm-d-inference-sim engine (zero latency settings, echo mode) is the fake backend; the
gateway (`llmfleet gateway --static-config`, pinned to CPU 0 when `taskset` exists) sits in
front of it. Each phase runs the same requests against both in the same run:

1. sequential non-streaming requests (one connection, keep-alive): p50/p99 direct vs gateway;
2. sequential streaming requests (16 tokens): time to first byte and to the end;
3. open-loop at a fixed rate (default 600 req/s, DESIGN.md §5's target): p50/p99;
4. closed-loop with 64 concurrent requests: requests/s (client-bound when equal).

Added latency = gateway minus direct of the same statistic. The gateway's own
`llmfleet_gateway_overhead_seconds` histogram is printed too (its mean).

    python bench/gateway_overhead.py [--requests 2000] [--rate 600] [--seconds 5]

Peers (LiteLLM proxy, vllm-router) are not in this run yet: see the issue note.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from llmfleet.core.cluster import build
from llmfleet.core.cluster.toolchain import TOOLS_BY_NAME

MODEL = "bench-model"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def pinned(cpu: int, command: list[str]) -> list[str]:
    return ["taskset", "-c", str(cpu), *command] if shutil.which("taskset") else command


def wait_ready(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{url} did not become ready in {timeout}s")


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def sequential(
    client: httpx.Client, url: str, n: int, stream: bool
) -> tuple[list[float], list[float]]:
    """Per request: (time to first byte, time to the end), in seconds."""
    body = {**BODY, "max_tokens": 16, "stream": True} if stream else BODY
    first: list[float] = []
    total: list[float] = []
    for _ in range(n):
        start = time.perf_counter()
        with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
            chunks = response.iter_raw()
            next(chunks)
            first.append(time.perf_counter() - start)
            for _ in chunks:
                pass
        total.append(time.perf_counter() - start)
        if response.status_code != 200:
            raise SystemExit(f"{url}: status {response.status_code}")
    return first, total


async def open_loop(url: str, rate: float, seconds: float) -> tuple[list[float], int, float]:
    """Latencies, errors, and the rate the client really achieved (it may fall behind)."""
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    latencies: list[float] = []
    errors = 0
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as client:

        async def one() -> None:
            nonlocal errors
            start = time.perf_counter()
            try:
                response = await client.post("/v1/chat/completions", json=BODY)
            except httpx.HTTPError:
                errors += 1
                return
            latencies.append(time.perf_counter() - start)
            errors += response.status_code != 200

        tasks = []
        begin = time.perf_counter()
        for i in range(int(rate * seconds)):
            delay = begin + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one()))
        sent = time.perf_counter() - begin
        await asyncio.gather(*tasks)
    return latencies, errors, len(tasks) / sent


async def closed_loop(url: str, concurrency: int, seconds: float) -> float:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    done = 0
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as client:
        deadline = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                await client.post("/v1/chat/completions", json=BODY)
                done += 1

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.perf_counter() - start)


def row(name: str, direct: float, gateway: float, unit: Callable[[float], str]) -> None:
    print(f"  {name:<28} {unit(direct):>10} {unit(gateway):>10} {unit(gateway - direct):>10}")


def ms(value: float) -> str:
    return f"{value * 1000:.3f} ms"


def overhead_mean(url: str) -> str:
    text = httpx.get(url + "/metrics").text
    total = count = 0.0
    for line in text.splitlines():
        if line.startswith("llmfleet_gateway_overhead_seconds_sum"):
            total += float(line.rsplit(" ", 1)[1])
        elif line.startswith("llmfleet_gateway_overhead_seconds_count"):
            count += float(line.rsplit(" ", 1)[1])
    return f"{total / count * 1000:.3f} ms over {count:.0f} requests" if count else "no samples"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=600)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--profile", default="prefix-load")
    args = parser.parse_args()

    tool = TOOLS_BY_NAME["llm-d-inference-sim"]
    build.ensure_tools([tool])
    sim_port, gw_port = free_port(), free_port()
    direct, gateway = f"http://127.0.0.1:{sim_port}", f"http://127.0.0.1:{gw_port}"
    sim_cmd = [str(build.binary(tool, "llm-d-inference-sim")), "--port", str(sim_port)]
    sim_cmd += [
        "--model",
        MODEL,
        "--force-dummy-tokenizer",
        "--mode",
        "echo",
        "--max-num-seqs",
        "1024",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "fleet.yaml"
        config.write_text(f"models:\n  {MODEL}:\n    unified: [{direct}]\n")
        gw_cmd = [str(Path(sys.executable).parent / "llmfleet"), "gateway", "--static-config"]
        gw_cmd += [
            str(config),
            "--host",
            "127.0.0.1",
            "--port",
            str(gw_port),
            "--profile",
            args.profile,
        ]
        processes = [
            subprocess.Popen(
                pinned(1, sim_cmd), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            ),
            subprocess.Popen(
                pinned(0, gw_cmd), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            ),
        ]
        try:
            wait_ready(direct + "/health/ready")
            wait_ready(gateway + "/readyz")
            run(direct, gateway, args)
        finally:
            for process in processes:
                process.terminate()
                process.wait(timeout=10)


def run(direct: str, gateway: str, args: argparse.Namespace) -> None:
    print(f"{'':<30} {'direct':>10} {'gateway':>10} {'added':>10}")
    with httpx.Client(timeout=30) as client:
        for url in (direct, gateway):  # warm-up: connections, caches, JIT-free but still
            sequential(client, url, 200, stream=False)
        half = args.requests // 2
        results: dict[str, list[float]] = {direct: [], gateway: []}
        for _ in range(2):  # interleave halves so drift on a shared machine hits both
            for url in (direct, gateway):
                results[url] += sequential(client, url, half, stream=False)[1]
        print(f"sequential non-streaming ({args.requests} each)")
        for name, q in (("p50", 0.5), ("p99", 0.99)):
            row(name, quantile(results[direct], q), quantile(results[gateway], q), ms)
        first: dict[str, list[float]] = {}
        total: dict[str, list[float]] = {}
        for url in (direct, gateway):
            first[url], total[url] = sequential(client, url, half, stream=True)
        print(f"sequential streaming, 16 tokens ({half} each)")
        row(
            "first byte p50",
            statistics.median(first[direct]),
            statistics.median(first[gateway]),
            ms,
        )
        row(
            "whole stream p50",
            statistics.median(total[direct]),
            statistics.median(total[gateway]),
            ms,
        )
        row("whole stream p99", quantile(total[direct], 0.99), quantile(total[gateway], 0.99), ms)
    paced = {url: asyncio.run(open_loop(url, args.rate, args.seconds)) for url in (direct, gateway)}
    print(f"open loop at {args.rate:.0f} req/s for {args.seconds:.0f} s")
    for name, q in (("p50", 0.5), ("p99", 0.99)):
        row(name, quantile(paced[direct][0], q), quantile(paced[gateway][0], q), ms)
    print(f"  errors: direct {paced[direct][1]}, gateway {paced[gateway][1]}")
    achieved = f"{paced[direct][2]:.0f} / {paced[gateway][2]:.0f} req/s"
    print(f"  rate the client achieved (direct / gateway): {achieved}; below target = client-bound")
    rps = {url: asyncio.run(closed_loop(url, 64, args.seconds)) for url in (direct, gateway)}
    print("closed loop, 64 concurrent")
    row("requests/s", rps[direct], rps[gateway], lambda v: f"{v:.0f}")
    print(f"gateway's own overhead histogram: mean {overhead_mean(gateway)}")


if __name__ == "__main__":
    main()
