"""The gateway says how late its event loop runs (`loop_lag`) and what discovery routes to
(`DiscoveredCollector`): a loop held by synchronous work shows as lag, and the discovered counts
follow the snapshot."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from llmfleet.gateway.app import create_app
from llmfleet.gateway.discovery import Pool, Service, StaticDiscovery
from llmfleet.gateway.loop_lag import SCHEDSTAT, CpuWait, LoopLag
from llmfleet.gateway.metrics import Pace
from llmfleet.gateway.settings import GatewaySettings
from tests.gateway.servers import ThreadServer, gateway
from tests.net import wait_for


def test_a_loop_held_by_synchronous_work_shows_as_lag() -> None:
    registry = CollectorRegistry()
    histogram = Histogram("lag_seconds", "lag", buckets=(0.01, 0.1, 1), registry=registry)
    largest = Gauge("lag_max_seconds", "largest", registry=registry)
    own = Histogram("own_seconds", "own", buckets=(0.01, 0.1, 1), registry=registry)
    own_largest = Gauge("own_max_seconds", "largest own", registry=registry)

    async def scenario() -> tuple[float, float]:
        lag = LoopLag.started(histogram, largest, tick=0.01, own=own, own_largest=own_largest)
        await asyncio.sleep(0.1)
        calm = lag.max_seconds
        time.sleep(0.3)  # holding the loop is the point
        await asyncio.sleep(0.05)
        await lag.stop()
        return calm, lag.max_seconds

    calm, held = asyncio.run(scenario())
    assert calm < 0.1, calm
    assert 0.2 <= held < 1.0, held
    assert registry.get_sample_value("lag_max_seconds") == held
    # a hold of the loop's own (the thread sleeps, it does not wait for a CPU): all of it own
    own_held = registry.get_sample_value("own_max_seconds") or 0.0
    assert 0.2 <= own_held <= held, (own_held, held)
    assert registry.get_sample_value("lag_seconds_bucket", {"le": "0.1"}) >= 5
    assert registry.get_sample_value("lag_seconds_bucket", {"le": "0.1"}) < (
        registry.get_sample_value("lag_seconds_count") or 0
    )


def _lag_metrics() -> tuple[CollectorRegistry, dict[str, Any]]:
    registry = CollectorRegistry()
    buckets = (0.001, 0.005, 0.01, 0.1, 1)
    return registry, {
        "histogram": Histogram("lag_seconds", "", buckets=buckets, registry=registry),
        "largest": Gauge("lag_max_seconds", "", registry=registry),
        "own": Histogram("own_seconds", "", buckets=buckets, registry=registry),
        "own_largest": Gauge("own_max_seconds", "", registry=registry),
        "cpu_wait": Counter("cpu_wait_seconds", "", registry=registry),
    }


def test_own_lag_is_the_lag_less_the_wait_for_a_cpu() -> None:
    registry, metrics = _lag_metrics()
    lag = LoopLag(**metrics)
    lag._observe(0.012, 0.010)  # mostly waiting for a CPU
    lag._observe(0.008, 0.0)  # the gateway's own hold
    lag._observe(0.001, 0.004)  # a wait that made no lag: own lag is never negative
    assert lag.max_seconds == 0.012
    assert lag.own_max_seconds == 0.008
    assert registry.get_sample_value("own_max_seconds") == 0.008
    assert registry.get_sample_value("cpu_wait_seconds_total") == 0.014
    assert registry.get_sample_value("own_seconds_bucket", {"le": "0.005"}) == 2  # 0.002, 0.0
    assert registry.get_sample_value("lag_seconds_bucket", {"le": "0.005"}) == 1


def test_cpu_wait_reads_the_threads_run_queue_wait(tmp_path: Path) -> None:
    stat = tmp_path / "schedstat"
    stat.write_text("532046973 201080 22\n")
    cpu = CpuWait(str(stat))
    assert cpu.waited() == 201080 / 1e9
    stat.write_text("532046973 3201080 23\n")
    assert cpu.waited() == 3201080 / 1e9  # read afresh each time
    cpu.close()
    assert CpuWait(str(tmp_path / "absent")).waited() is None
    stat.write_text("not numbers\n")
    assert CpuWait(str(stat)).waited() is None  # unreadable: own lag is the whole lag


@pytest.mark.skipif(not os.path.exists(SCHEDSTAT), reason="Linux without schedstat")
def test_a_loop_that_waits_for_a_busy_cpu_shows_lag_that_is_not_its_own() -> None:
    """The loop's thread, busy half the time, shares one CPU with two processes that never
    sleep: its timers are late because it waits for the CPU, which the kernel counts, and its
    own lag stays below that."""
    registry, metrics = _lag_metrics()
    cpu = os.sched_getaffinity(0)
    one = {min(cpu)}
    spin = "import os, sys; os.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass"
    hogs = [subprocess.Popen([sys.executable, "-c", spin, str(min(cpu))]) for _ in range(2)]

    async def scenario() -> LoopLag:
        lag = LoopLag(**metrics, tick=0.01)
        lag.start()
        end = time.monotonic() + 1.5
        while time.monotonic() < end:  # a busy gateway: 2 ms steps, as much time idle
            step = time.thread_time() + 0.002
            while time.thread_time() < step:
                pass
            await asyncio.sleep(0.002)
        await lag.stop()
        return lag

    try:
        os.sched_setaffinity(0, one)  # this thread, and the loop's (asyncio.run runs here)
        lag = asyncio.run(scenario())
    finally:
        os.sched_setaffinity(0, cpu)
        for hog in hogs:
            hog.kill()
            hog.wait()
    waited = registry.get_sample_value("cpu_wait_seconds_total") or 0.0
    assert waited > 0.05, waited
    assert lag.max_seconds > 0.001, lag.max_seconds
    assert lag.own_max_seconds < lag.max_seconds


def service(model: str, *endpoints: str) -> Service:
    return Service(model, "ns", model, {"unified": Pool("unified", tuple(endpoints))})


def sample(text: str, name: str) -> float | None:
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(found[1]) if found else None


def test_metrics_count_what_discovery_routes_to_and_the_loops_lag() -> None:
    discovery = StaticDiscovery(
        {
            "m1": service("m1", "http://127.0.0.1:1", "http://127.0.0.1:2"),
            "m2": service("m2", "http://127.0.0.1:3"),
        }
    )
    with gateway(discovery) as server:

        def metrics() -> str:
            return httpx.get(f"{server.url}/metrics", timeout=5).text

        text = metrics()
        assert sample(text, "llmfleet_gateway_discovered_services") == 2
        assert sample(text, 'llmfleet_gateway_discovered_endpoints{role="unified"}') == 3
        wait_for(
            lambda: (
                (sample(metrics(), "llmfleet_gateway_event_loop_lag_seconds_count") or 0) >= 3
                or None
            ),
            10,
            "three samples of the loop's lag",
        )
        largest = sample(metrics(), "llmfleet_gateway_event_loop_lag_max_seconds")
        assert largest is not None
        assert largest < 1.0, largest


def test_metrics_are_rendered_off_the_event_loop() -> None:
    """At 1,000 services /metrics is megabytes (about a second to render): not on the loop
    every request waits on. The render runs in another thread than the one serving requests."""
    app = create_app(GatewaySettings(), discovery=StaticDiscovery({}))
    metrics = app.state.metrics
    rendered_in: list[str] = []
    render = metrics.exposition_chunks

    def recording(pace: Pace, names: Collection[str] = ()) -> list[bytes]:
        rendered_in.append(threading.current_thread().name)
        assert pace is not None  # paced, so the loop keeps the GIL (`metrics.Pace`)
        return render(pace, names)

    metrics.exposition_chunks = recording  # type: ignore[method-assign]
    with ThreadServer(app) as server:
        assert httpx.get(f"{server.url}/healthz", timeout=5).status_code == 200
        text = httpx.get(f"{server.url}/metrics", timeout=5).text
        assert "llmfleet_gateway_discovered_services" in text
        loop_thread = server.thread.name
    assert rendered_in
    assert rendered_in[0] != loop_thread
