"""Benchmark: how long a gateway's /metrics render holds its event loop at fleet scale, this
checkout beside `--baseline` (issue 28).

    .venv/bin/llmfleet isolated -- .venv/bin/python bench/metrics_render_stalls.py \\
        [--pools 1000] [--seconds 20] [--rounds 3] [--baseline REV]

At 1,000 pools with traffic the gateway's /metrics is ~7.7 MB. It is rendered in a worker
thread, paced (`metrics.Pace`), but a thread shares the GIL with the event loop, and a single C
call that holds it (a join of megabytes, its encoding) is a stall no switch interval breaks.
Each revision's process (this checkout, and `--baseline`'s source roots with PYTHONPATH as
`_support.checkout` gives them) fills its `GatewayMetrics` with `--pools` pools that have served
a request, then for `--seconds`:
- a thread renders the exposition again and again, as the /metrics route does (the revision's
  `exposition_chunks` where it has one, else `exposition`), the collector paused meanwhile;
- on the event loop (uvloop, the GIL's switch interval as the gateway sets it), a task asks for
  a 1 ms sleep, again and again, and keeps how much later than asked each returned.
A render without a break every ~20 s (Prometheus's scrape) is magnified here into ~10 a second,
so compare counts between revisions, not with a production scrape rate. "no render" is this
checkout's process with no render thread: what the machine's own noise gives. Per revision:
loop lag p99 / p99.9 / max and the ticks later than 5 ms (the issue's lag goal) per second;
renders per second; medians over the rounds. Compare within the run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _support import checkout, worker

TICK = 0.001


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pools", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", help="a commit to measure beside this checkout")
    parser.add_argument("--worker", choices=("render", "idle"), help=argparse.SUPPRESS)
    return parser.parse_args()


def measure(args: argparse.Namespace) -> dict[str, float]:
    """In this process: the loop's lag while a thread renders (or not, `idle`)."""
    import uvloop  # noqa: PLC0415 (the revision's environment, in its own process)

    from llmfleet.gateway import app as app_module  # noqa: PLC0415
    from llmfleet.gateway.metrics import GatewayMetrics  # noqa: PLC0415

    try:
        from llmfleet.core.gc_paused import collector_paused  # noqa: PLC0415
    except ImportError:  # a revision from before it moved to core
        from llmfleet.gateway.gc_pauses import collector_paused  # type: ignore[attr-defined,no-redef]  # noqa: PLC0415

    sys.setswitchinterval(0.001)  # the gateway's `gil_switch_interval_seconds`
    metrics = GatewayMetrics(discovered=lambda: {})
    for index in range(args.pools):
        pool = metrics.pool(("bench", f"svc-{index:04d}", "unified", f"model-{index}", ""))
        pool.count_outcome("ok")
        pool.observe_e2e(0.2)
        pool.observe_ttft(0.05)
    render = getattr(metrics, "exposition_chunks", None) or metrics.exposition
    stop = threading.Event()
    renders: list[int] = []

    def rendering() -> None:
        while not stop.is_set():
            with collector_paused():
                body = render(app_module.PACE)
            renders.append(len(body) if isinstance(body, bytes) else sum(map(len, body)))

    async def ticks() -> list[float]:
        lags = []
        end = time.perf_counter() + args.seconds
        while time.perf_counter() < end:
            asked = time.perf_counter() + TICK
            await asyncio.sleep(TICK)
            lags.append(max(0.0, time.perf_counter() - asked))
        return lags

    thread = threading.Thread(target=rendering, daemon=True)
    if args.worker == "render":
        thread.start()
    lags = sorted(uvloop.run(ticks()))
    stop.set()
    n = len(lags)
    return {"p99": lags[int(n * 0.99)], "p999": lags[int(n * 0.999)], "max": lags[-1],
            "over5": sum(lag > 0.005 for lag in lags) / args.seconds,
            "renders": len(renders) / args.seconds,
            "mb": (renders[0] if renders else 0) / 1e6}  # fmt: skip


def run(args: argparse.Namespace, source: Path | None, kind: str) -> dict[str, float]:
    command = [__file__, "--worker", kind, "--pools", str(args.pools),
               "--seconds", str(args.seconds)]  # fmt: skip
    return dict(worker(command, source, what=f"{kind} worker"))


def main() -> None:
    args = parse_args()
    if args.worker:
        print(json.dumps(measure(args)))
        return
    with tempfile.TemporaryDirectory() as work:
        revisions: dict[str, tuple[Path | None, str]] = {
            "no render": (None, "idle"), "this checkout": (None, "render")}  # fmt: skip
        if args.baseline:
            revisions[f"@{args.baseline}"] = (checkout(args.baseline, Path(work) / "b"), "render")
        print(f"{args.pools} pools with traffic, {args.seconds:.0f} s a round, {args.rounds} "
              f"rounds; {os.cpu_count()} CPUs")  # fmt: skip
        results: dict[str, list[dict[str, float]]] = {name: [] for name in revisions}
        for round_ in range(args.rounds):
            order = list(revisions)
            if round_ % 2:
                order.reverse()
            for name in order:
                found = run(args, *revisions[name])
                results[name].append(found)
                print(f"round {round_ + 1}: {name}: {line(found)}", flush=True)
        print(f"\n{'revision':<20}{'lag p99 [ms]':>14}{'p99.9':>8}{'max':>8}{'> 5 ms [/s]':>13}"
              f"{'renders [/s]':>14}{'MB':>6}")  # fmt: skip
        for name, found in results.items():
            mid = {key: statistics.median(f[key] for f in found) for key in found[0]}
            print(f"{name:<20}{mid['p99'] * 1000:>14.2f}{mid['p999'] * 1000:>8.2f}"
                  f"{max(f['max'] for f in found) * 1000:>8.1f}{mid['over5']:>13.2f}"
                  f"{mid['renders']:>14.1f}{mid['mb']:>6.1f}")  # fmt: skip


def line(found: dict[str, Any]) -> str:
    return (f"lag p99 {found['p99'] * 1000:.2f} ms, p99.9 {found['p999'] * 1000:.2f}, max "
            f"{found['max'] * 1000:.1f}, > 5 ms {found['over5']:.2f}/s, renders "
            f"{found['renders']:.1f}/s")  # fmt: skip


if __name__ == "__main__":
    main()
