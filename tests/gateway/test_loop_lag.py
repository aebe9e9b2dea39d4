"""The gateway says how late its event loop runs (`loop_lag`) and what discovery routes to
(`DiscoveredCollector`): a loop held by synchronous work shows as lag, and the discovered counts
follow the snapshot."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Collection

import httpx
from prometheus_client import CollectorRegistry, Gauge, Histogram

from llmfleet.gateway.app import create_app
from llmfleet.gateway.discovery import Pool, Service, StaticDiscovery
from llmfleet.gateway.loop_lag import LoopLag
from llmfleet.gateway.metrics import Pace
from llmfleet.gateway.settings import GatewaySettings
from tests.gateway.servers import ThreadServer, gateway
from tests.net import wait_for


def test_a_loop_held_by_synchronous_work_shows_as_lag() -> None:
    registry = CollectorRegistry()
    histogram = Histogram("lag_seconds", "lag", buckets=(0.01, 0.1, 1), registry=registry)
    largest = Gauge("lag_max_seconds", "largest", registry=registry)

    async def scenario() -> tuple[float, float]:
        lag = LoopLag.started(histogram, largest, tick=0.01)
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
    assert registry.get_sample_value("lag_seconds_bucket", {"le": "0.1"}) >= 5
    assert registry.get_sample_value("lag_seconds_bucket", {"le": "0.1"}) < (
        registry.get_sample_value("lag_seconds_count") or 0
    )


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
    render = metrics.exposition

    def recording(pace: Pace | None = None, names: Collection[str] = ()) -> bytes:
        rendered_in.append(threading.current_thread().name)
        assert pace is not None  # paced, so the loop keeps the GIL (`metrics.Pace`)
        return render(pace, names)

    metrics.exposition = recording  # type: ignore[method-assign]
    with ThreadServer(app) as server:
        assert httpx.get(f"{server.url}/healthz", timeout=5).status_code == 200
        text = httpx.get(f"{server.url}/metrics", timeout=5).text
        assert "llmfleet_gateway_discovered_services" in text
        loop_thread = server.thread.name
    assert rendered_in
    assert rendered_in[0] != loop_thread
