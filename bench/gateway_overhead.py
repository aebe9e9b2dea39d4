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

`--baseline REV` also starts the gateway of git revision REV (checked out in a temporary
worktree, imported ahead of this checkout) in front of the same engine, on the same core, and
runs every phase against it too: a before/after of a change in one run. The two gateways
alternate per phase; figures of one run only compare within the run.

    python bench/gateway_overhead.py [--requests 2000] [--rate 600] [--seconds 5] [--baseline REV]

Peers (LiteLLM proxy, vllm-router) are not in this run yet: see the issue note.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from _support import free_port, pinned, wait_ready

from llmfleet.core.cluster import build
from llmfleet.core.cluster.toolchain import TOOLS_BY_NAME

MODEL = "bench-model"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8}


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


def row(name: str, values: list[float], unit: Callable[[float], str]) -> None:
    """One statistic for direct, then each gateway, then what each gateway adds."""
    direct, gateways = values[0], values[1:]
    cells = [unit(v) for v in values] + [unit(v - direct) for v in gateways]
    print(f"  {name:<28}" + "".join(f" {cell:>11}" for cell in cells))


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
    parser.add_argument(
        "--baseline", metavar="REV", help="also measure the gateway of this git revision"
    )
    args = parser.parse_args()

    tool = TOOLS_BY_NAME["llm-d-inference-sim"]
    build.ensure_tools([tool])
    sim_port, gw_port = free_port(), free_port()
    direct = f"http://127.0.0.1:{sim_port}"
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
        gateways = {"gateway": (gw_port, _gateway_command(config, gw_port, args.profile), None)}
        if args.baseline:
            base_port = free_port()
            source = _worktree(args.baseline, Path(tmp) / "baseline")
            command = _gateway_command(config, base_port, args.profile, source)
            gateways = {"baseline": (base_port, command, source), **gateways}
        processes = [
            subprocess.Popen(
                pinned(1, sim_cmd), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
        ]
        for _, command, _source in gateways.values():
            processes.append(
                subprocess.Popen(
                    pinned(0, command), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                )
            )
        try:
            wait_ready(direct + "/health/ready")
            urls = {"direct": direct}
            for name, (port, _, _source) in gateways.items():
                urls[name] = f"http://127.0.0.1:{port}"
                wait_ready(urls[name] + "/readyz")
            run(urls, args)
        finally:
            for process in processes:
                process.terminate()
                process.wait(timeout=10)
            if args.baseline:
                subprocess.run(
                    ["git", "worktree", "remove", "--force", str(Path(tmp) / "baseline")],
                    check=False,
                    capture_output=True,
                )


def _worktree(revision: str, path: Path) -> Path:
    """A checkout of `revision` at `path` (a detached git worktree of this repository)."""
    subprocess.run(
        ["git", "worktree", "add", "--detach", "--quiet", str(path), revision],
        check=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    return path


def _gateway_command(
    config: Path, port: int, profile: str, source: Path | None = None
) -> list[str]:
    """`llmfleet gateway` of this checkout, or of the checkout at `source` (its packages put
    ahead of the editable install on sys.path)."""
    args = ["--static-config", str(config), "--host", "127.0.0.1", "--port", str(port)]
    args += ["--profile", profile]
    if source is None:
        return [str(Path(sys.executable).parent / "llmfleet"), "gateway", *args]
    roots = [str(source / part) for part in ("core", "crds", "gateway")]
    code = (
        f"import sys; sys.path[:0] = {roots!r}; sys.argv = ['llmfleet-gateway', *{args!r}]; "
        "from llmfleet.gateway.cli import main; main()"
    )
    return [sys.executable, "-c", code]


def run(urls: dict[str, str], args: argparse.Namespace) -> None:
    names = list(urls)
    gateways = names[1:]
    header = names + [f"+{name}" for name in gateways]
    print(f"{'':<30}" + "".join(f" {name:>11}" for name in header))
    targets = list(urls.values())
    with httpx.Client(timeout=30) as client:
        for url in targets:  # warm-up: connections, caches
            sequential(client, url, 200, stream=False)
        half = args.requests // 2
        results: dict[str, list[float]] = {url: [] for url in targets}
        for _ in range(2):  # interleave halves so drift on a shared machine hits all
            for url in targets:
                results[url] += sequential(client, url, half, stream=False)[1]
        print(f"sequential non-streaming ({args.requests} each)")
        for name, q in (("p50", 0.5), ("p99", 0.99)):
            row(name, [quantile(results[url], q) for url in targets], ms)
        first: dict[str, list[float]] = {}
        total: dict[str, list[float]] = {}
        for url in targets:
            first[url], total[url] = sequential(client, url, half, stream=True)
        print(f"sequential streaming, 16 tokens ({half} each)")
        row("first byte p50", [statistics.median(first[url]) for url in targets], ms)
        row("whole stream p50", [statistics.median(total[url]) for url in targets], ms)
        row("whole stream p99", [quantile(total[url], 0.99) for url in targets], ms)
    paced = {url: asyncio.run(open_loop(url, args.rate, args.seconds)) for url in targets}
    print(f"open loop at {args.rate:.0f} req/s for {args.seconds:.0f} s")
    for name, q in (("p50", 0.5), ("p99", 0.99)):
        row(name, [quantile(paced[url][0], q) for url in targets], ms)
    print("  errors: " + ", ".join(f"{n} {paced[u][1]}" for n, u in urls.items()))
    achieved = " / ".join(f"{paced[url][2]:.0f}" for url in targets)
    print(f"  rate the client achieved ({' / '.join(names)}): {achieved} req/s; below target = "
          "client-bound")  # fmt: skip
    rps = {url: asyncio.run(closed_loop(url, 64, args.seconds)) for url in targets}
    print("closed loop, 64 concurrent")
    row("requests/s", [rps[url] for url in targets], lambda v: f"{v:.0f}")
    for name in gateways:
        print(f"{name}'s own overhead histogram: mean {overhead_mean(urls[name])}")


if __name__ == "__main__":
    main()
