"""Benchmark: the gateway's discovery rebuilding its snapshot after one change at fleet scale,
this checkout beside `--baseline` (issue 28).

    .venv/bin/llmfleet isolated -- .venv/bin/python bench/discovery_rebuild.py \\
        [--services 1000 --pods-per-service 10] [--changes 50] [--rounds 3] [--baseline REV]

A change to one service (a pod of its pool going unready, or back) reaches a gateway as one
EndpointSlice event; `KubeDiscovery` then rebuilds its snapshot from the informers' memory in a
worker thread, diffs it with the current one for its log and swaps it in. This measures that
rebuild, without a cluster, in the process of each revision (this checkout, and `--baseline`'s
source roots run with PYTHONPATH as `_support.checkout` gives them), in turn for `--rounds`:
- `--services` InferenceServices of one unified pool and their EndpointSlices of
  `--pods-per-service` ready endpoints each, held by the revision's own `WatchedLister` over
  two real informers (`llmfleet.core.informer`) wired as its `kubernetes_lister` wires them,
  whose LIST and WATCH are served from memory (`_Server`);
- `--changes` changes, one at a time: a MODIFIED event of one slice with one endpoint's
  readiness flipped, applied by its informer, then `KubeDiscovery.refresh()` awaited (the
  revision rebuilds what it rebuilds: the whole fleet before `kept_snapshot`, the touched service
  with it). Per change: its wall time, the CPU time of the whole process, and
  the largest lag of the event loop meanwhile (a task asks for a 1 ms sleep, again and again,
  and measures how much later it returns: what requests in flight would have waited, the
  worker thread holding the GIL included).
Each change is also checked: the snapshot after it routes to exactly the new endpoints. Each
revision's process has the switches its gateway sets (`as_the_gateway`: the GIL's switch
interval since `gil_switch_interval_seconds`).
Medians (and the largest lag) per revision; compare within the run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from _support import REPO, checkout, worker


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--services", type=int, default=1000)
    parser.add_argument("--pods-per-service", type=int, default=10)
    parser.add_argument("--changes", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", help="a commit to measure beside this checkout")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args()


def fleet(services: int, pods: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """InferenceServices and EndpointSlices as the API server lists them (the informers keep
    what discovery reads of them)."""
    found, slices = [], []
    for index in range(services):
        name = f"svc-{index:04d}"
        found.append({
            "metadata": {"namespace": "bench", "name": name, "uid": f"uid-{index}",
                         "generation": 1, "creationTimestamp": "2026-11-28T00:00:00Z",
                         "resourceVersion": "1"},
            "spec": {"model": {"name": "org/model", "servedName": f"model-{index}"},
                     "topology": {"unified": {"replicas": pods}}},
            "status": {"revision": "abc"},
        })  # fmt: skip
        slices.append(endpoint_slice(index, [True] * pods))
    return found, slices


def endpoint_slice(index: int, ready: list[bool]) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "bench", "name": f"svc-{index:04d}-unified-abcde",
                     "labels": {"kubernetes.io/service-name": f"svc-{index:04d}-unified"}},
        "ports": [{"name": "http", "port": 8000}],
        "endpoints": [{"addresses": [f"10.{index // 250}.{index % 250}.{pod}"],
                       "conditions": {"ready": up}} for pod, up in enumerate(ready)],
    }  # fmt: skip


def as_the_gateway() -> None:
    """The revision's process-wide switches, as its gateway sets them (`server.process_wide`,
    where it has one: the GIL's switch interval)."""
    from llmfleet.gateway import server  # noqa: PLC0415
    from llmfleet.gateway.settings import GatewaySettings  # noqa: PLC0415

    process_wide = getattr(server, "process_wide", None)
    if process_wide is not None:
        process_wide(GatewaySettings())


class _Server:
    """One kind's LIST (`items`), then a WATCH yielding what is put in `events` (None ends it):
    what the informers of discovery read, without an API server."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()

    def list(self) -> dict[str, Any]:
        return {"metadata": {"resourceVersion": "1"}, "items": self.items}

    def watch(self, version: str) -> Any:
        while (event := self.events.get()) is not None:
            yield event


def _lister(services: list[dict[str, Any]], slices: list[dict[str, Any]]) -> Any:
    """Discovery's `WatchedLister` over two real informers fed by `_Server`s, wired as the
    revision's `kubernetes_lister` wires them (its change callbacks and slice index, where it
    has them)."""
    from llmfleet.core.informer import Informer  # noqa: PLC0415
    from llmfleet.gateway import kube_discovery as kd  # noqa: PLC0415

    changes = kd.Changes()
    servers = _Server(services), _Server(slices)
    by_slice = getattr(kd, "pool_of_slice", None)
    informers = [
        Informer("inferenceservices", servers[0].list, servers[0].watch,
                 on_change=getattr(changes, "service", changes), transform=kd.kept_service),
        Informer("endpointslices", servers[1].list, servers[1].watch,
                 on_change=getattr(changes, "endpoint_slice", changes),
                 transform=kd.kept_slice, **({"index": by_slice} if by_slice else {})),
    ]  # fmt: skip
    return kd.WatchedLister(informers, 30, changes), servers


async def measure(args: argparse.Namespace) -> list[dict[str, float]]:
    from llmfleet.gateway.kube_discovery import KubeDiscovery  # noqa: PLC0415

    services, slices = fleet(args.services, args.pods_per_service)
    lister, (_, slice_server) = _lister(services, slices)
    discovery = KubeDiscovery(lister)
    await discovery.refresh()
    lags: list[float] = []

    async def sample() -> None:
        loop = asyncio.get_running_loop()
        while True:
            asked = loop.time() + 0.001
            await asyncio.sleep(0.001)
            lags.append(loop.time() - asked)

    async def told(ready: list[bool], index: int, version: int) -> None:
        """The slice event sent and applied by its informer (its change told)."""
        seen = lister.changes.count
        changed = endpoint_slice(index, ready)
        changed["metadata"]["resourceVersion"] = str(version)
        slice_server.events.put({"type": "MODIFIED", "object": changed})
        while lister.changes.count == seen:
            await asyncio.sleep(0.0005)

    sampler = asyncio.create_task(sample())
    found = []
    for change in range(args.changes):
        index = (change * 37) % args.services
        ready = [pod != change % args.pods_per_service for pod in range(args.pods_per_service)]
        await told(ready, index, 2 * change + 2)
        await asyncio.sleep(0.02)
        lags.clear()
        started, cpu = time.perf_counter(), time.process_time()
        await discovery.refresh()
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        routed = discovery.services()[f"model-{index}"].pools["unified"].endpoints
        if len(routed) != sum(ready):
            raise SystemExit(f"change {change}: {len(routed)} endpoints routed, {sum(ready)} ready")
        found.append({"wall": wall, "cpu": cpu, "lag": max(lags, default=0.0)})
        # back to all ready, unmeasured, so the next change starts from the whole fleet
        await told([True] * args.pods_per_service, index, 2 * change + 3)
        await discovery.refresh()
    sampler.cancel()
    slice_server.events.put(None)
    return found


def run(args: argparse.Namespace, source: Path | None) -> list[dict[str, float]]:
    command = [__file__, "--worker", "--services", str(args.services),
               "--pods-per-service", str(args.pods_per_service),
               "--changes", str(args.changes)]  # fmt: skip
    return list(worker(command, source))


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.1f}"


def main() -> None:
    args = parse_args()
    if args.worker:
        as_the_gateway()
        print(json.dumps(asyncio.run(measure(args))))
        return
    with tempfile.TemporaryDirectory(prefix="discovery-rebuild-") as work:
        revisions: dict[str, Path | None] = {"this checkout": None}
        if args.baseline:
            revisions[f"@{args.baseline}"] = checkout(args.baseline, Path(work) / "baseline")
        print(f"{args.services} services x {args.pods_per_service} endpoints, {args.changes} "
              f"changes a round, {args.rounds} rounds; {os.cpu_count()} CPUs; {REPO}")  # fmt: skip
        results: dict[str, list[dict[str, float]]] = {name: [] for name in revisions}
        for round_ in range(args.rounds):
            order = list(revisions.items())
            for name, source in order[round_ % 2 :] + order[: round_ % 2]:
                found = run(args, source)
                results[name] += found
                print(f"round {round_ + 1}: {name}: rebuild p50 {ms([f['wall'] for f in found])} "
                      f"ms, CPU p50 {ms([f['cpu'] for f in found])} ms, loop lag p50 "
                      f"{ms([f['lag'] for f in found])} ms, max "
                      f"{max(f['lag'] for f in found) * 1000:.1f} ms")  # fmt: skip
        print(f"\n{'revision':<22}{'rebuild p50 [ms]':>18}{'p90':>8}{'CPU p50 [ms]':>14}"
              f"{'loop lag p50 [ms]':>19}{'lag max [ms]':>14}")  # fmt: skip
        for name, found in results.items():
            walls = sorted(f["wall"] for f in found)
            print(f"{name:<22}{ms(walls):>18}{walls[int(len(walls) * 0.9)] * 1000:>8.1f}"
                  f"{ms([f['cpu'] for f in found]):>14}{ms([f['lag'] for f in found]):>19}"
                  f"{max(f['lag'] for f in found) * 1000:>14.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
