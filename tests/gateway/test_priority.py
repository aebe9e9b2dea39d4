"""Priorities and degradation under load (`policies/priority`), through the real gateway in front
of llm-d-inference-sim engines.

- A pool whose engines really queue (one sequence at a time, slow tokens) and report it on
  /metrics: sheddable requests go to the cheap service while critical ones stay, and a critical
  request is answered much sooner than when the sheddable ones queue ahead of it at the engine.
- Saturation read from engines reporting fixed figures (`--fake-metrics`): queue depth, KV-cache
  usage, stale figures (injected clock), no cheaper service (429).
- Admission at capacity by in-flight shares (held streams), and each request's class from its
  tenant and the `x-llmfleet-priority` header.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmfleet.crds.policy import TrafficSpec
from llmfleet.gateway.app import create_app
from llmfleet.gateway.discovery import Pool, Service, StaticDiscovery
from llmfleet.gateway.endpoints import EndpointTable
from llmfleet.gateway.proxy import Forwarder
from llmfleet.gateway.settings import GatewaySettings
from llmfleet.gateway.tenants import Tenants
from tests.gateway.servers import Sim, ThreadServer, gateway
from tests.net import wait_for

BIG, SMALL = "big", "small"
BUSY = '{"waiting-requests":50,"running-requests":5,"kv-cache-usage":0.2}'
KV_FULL = '{"waiting-requests":0,"running-requests":5,"kv-cache-usage":0.9}'


def _discovery(big: str, small: str, degradation: dict[str, Any] | None) -> StaticDiscovery:
    """Services `big` (with `degradation`, to `small` unless it names another service), `small`
    and `empty` (no endpoints) on the engines at these URLs."""
    traffic = TrafficSpec.model_validate(
        {"degradation": {"enabled": True, "service": SMALL, **degradation}}
        if degradation is not None
        else {}
    )
    services = {
        BIG: Service(BIG, "ns", BIG, {"unified": Pool("unified", (big,))}, traffic),
        "empty": Service("empty", "ns", "empty", {"unified": Pool("unified", ())}),
        SMALL: Service(SMALL, "ns", SMALL, {"unified": Pool("unified", (small,))}),
    }
    return StaticDiscovery(services)


def _ask(
    url: str, priority: str | None, key: str | None = None, body: dict[str, Any] | None = None
) -> httpx.Response:
    headers = {"x-llmfleet-priority": priority} if priority else {}
    if key:
        headers["authorization"] = f"Bearer {key}"
    payload = {"model": BIG, "messages": [{"role": "user", "content": "hi"}], **(body or {})}
    return httpx.post(f"{url}/v1/chat/completions", json=payload, headers=headers, timeout=60)


def _served_by(response: httpx.Response, engines: dict[str, str]) -> str:
    """Which engine answered ("big", "small"), or the refusal ("429 shed")."""
    if response.status_code != 200:
        return f"{response.status_code} {response.json()['error']['code']}"
    by_url = {url: name for name, url in engines.items()}
    served = by_url[response.headers["x-llmfleet-endpoint"]]
    degraded = response.headers.get("x-llmfleet-degraded") == "true"
    assert degraded == (served == SMALL), response.headers
    if degraded:
        assert response.headers["x-llmfleet-tier"] == SMALL
        if response.headers["content-type"].startswith("application/json"):
            assert response.json()["model"] == SMALL  # the body's model was rewritten
    return served


def _counter(server: ThreadServer, name: str, **labels: str) -> float:
    text = httpx.get(f"{server.url}/metrics").text
    total = 0.0
    for found, value in re.findall(rf"^{name}_total\{{([^}}]*)\}} (\S+)$", text, re.MULTILINE):
        pairs = dict(re.findall(r'(\w+)="([^"]*)"', found))
        if all(pairs.get(k) == v for k, v in labels.items()):
            total += float(value)
    return total


def _state(server: ThreadServer) -> Any:
    """The gateway app's state: its forwarder (in-flight counts) and endpoint table."""
    return server.server.config.app.state  # type: ignore[union-attr]


def _forwarder(server: ThreadServer) -> Forwarder:
    forwarder: Forwarder = _state(server).forwarder
    return forwarder


# --- the acceptance test: a pool whose engine really queues -------------------------------

LOOPERS = 4
"""Closed-loop standard clients keeping the big engine's queue at 3 waiting (one runs)."""
SHEDDABLE = 16
"""Sheddable requests sent at once while the big pool is saturated."""
WORK = {"max_tokens": 10, "ignore_eos": True}
"""Every request on the big engine: 10 tokens, about 0.3 s of the one sequence it runs."""


@pytest.fixture(scope="module")
def queueing(sim_binary: Path) -> Iterator[tuple[Sim, Sim]]:
    big = Sim(
        sim_binary, BIG, "--max-num-seqs", "1",
        "--time-to-first-token", "10ms", "--inter-token-latency", "30ms",
    )  # fmt: skip
    small = Sim(sim_binary, SMALL)
    try:
        yield big, small
    finally:
        big.kill()
        small.kill()


def _critical_latency(big: Sim, small: Sim, degrade: bool) -> tuple[float, list[str]]:
    """Saturate the big pool with standard traffic, send a burst of sheddable requests, then
    one critical request: its latency, and who served each sheddable request."""
    degradation = {"maxQueueDepth": 0, "enabled": degrade}
    engines = {BIG: big.url, SMALL: small.url}
    with (
        gateway(_discovery(big.url, small.url, degradation), scrape_interval_seconds=0.1) as gw,
        ThreadPoolExecutor(LOOPERS + SHEDDABLE) as pool,
    ):
        table = _state(gw).table
        stop = threading.Event()

        def loop() -> None:
            while not stop.is_set():
                assert _served_by(_ask(gw.url, "standard", body=WORK), engines) == BIG

        loopers = [pool.submit(loop) for _ in range(LOOPERS)]
        try:
            wait_for(
                lambda: _waiting(table, big.url) >= LOOPERS - 1 or None,
                20, "the big engine's queue on its /metrics, read by the gateway",
            )  # fmt: skip
            shed: list[Future[httpx.Response]] = [
                pool.submit(_ask, gw.url, "sheddable", None, WORK) for _ in range(SHEDDABLE)
            ]
            # The critical request comes after every sheddable one was placed: answered by
            # the small engine, or in flight to the big one (queued at the engine ahead of it).
            wait_for(
                lambda: sum(f.done() for f in shed)
                + _forwarder(gw).in_flight(BIG, "unified") - LOOPERS >= SHEDDABLE or None,
                30, "the sheddable requests to be placed",
            )  # fmt: skip
            started = time.perf_counter()
            critical = _ask(gw.url, "critical", body=WORK)
            latency = time.perf_counter() - started
            assert _served_by(critical, engines) == BIG
            served = [_served_by(f.result(), engines) for f in shed]
            if degrade:
                degraded = _counter(gw, "llmfleet_gateway_degraded", service=BIG, to=SMALL)
                assert degraded == SHEDDABLE
        finally:
            stop.set()
            for looper in loopers:
                looper.result()
    return latency, served


def _waiting(table: EndpointTable, url: str) -> float:
    load = table.get(url).load
    return load.waiting if load is not None else 0.0


def test_sheddable_traffic_goes_to_the_cheap_tier_and_critical_traffic_stays_fast(
    queueing: tuple[Sim, Sim],
) -> None:
    big, small = queueing
    without, served_without = _critical_latency(big, small, degrade=False)
    with_policy, served_with = _critical_latency(big, small, degrade=True)
    assert served_without == [BIG] * SHEDDABLE  # the baseline: they queue at the big engine
    assert served_with == [SMALL] * SHEDDABLE
    # Behind 3-4 standard requests instead of 3-4 + 16 sheddable ones: about 5 engine slots
    # of 0.3 s against about 20. Half is a wide margin on a noisy machine.
    assert with_policy < without / 2, (with_policy, without)


# --- saturation from the figures engines report --------------------------------------------


class FakeClock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def reporting(sim_binary: Path) -> Iterator[dict[str, Sim]]:
    started: dict[str, Sim] = {}
    try:
        started["busy"] = Sim(sim_binary, BIG, "--fake-metrics", BUSY)
        started["kv-full"] = Sim(sim_binary, BIG, "--fake-metrics", KV_FULL)
        started["idle"] = Sim(sim_binary, BIG)
        started[SMALL] = Sim(sim_binary, SMALL)
        yield started
    finally:
        for sim in started.values():
            sim.kill()


@pytest.mark.parametrize(
    ("engine", "degradation", "priority", "expected"),
    [
        pytest.param("busy", {}, "sheddable", SMALL, id="queue-degrades-sheddable"),
        pytest.param("busy", {}, "standard", BIG, id="standard-stays"),
        pytest.param("busy", {}, "critical", BIG, id="critical-stays"),
        pytest.param("busy", {"maxQueueDepth": 50}, "sheddable", BIG, id="queue-at-limit"),
        pytest.param("busy", {"enabled": False}, "sheddable", BIG, id="disabled"),
        pytest.param("busy", {"service": "gone"}, "sheddable", "429 shed", id="no-cheaper"),
        pytest.param("busy", {"service": "empty"}, "sheddable", "429 shed", id="no-engines"),
        pytest.param("kv-full", {}, "sheddable", SMALL, id="kv-over-slo-default"),
        pytest.param("kv-full", {"maxKvCacheUsage": 0.95}, "sheddable", BIG, id="kv-own-limit"),
        pytest.param("idle", {"maxQueueDepth": 0}, "sheddable", BIG, id="idle"),
    ],
)
def test_saturation_from_scraped_figures(
    reporting: dict[str, Sim],
    engine: str,
    degradation: dict[str, Any],
    priority: str,
    expected: str,
) -> None:
    big, small = reporting[engine], reporting[SMALL]
    with gateway(_discovery(big.url, small.url, degradation)) as server:
        _ask(server.url, "critical")  # traffic makes the pool active: its engine is scraped
        wait_for(lambda: _state(server).table.get(big.url).load, 30, "the first scrape")
        response = _ask(server.url, priority)
        assert _served_by(response, {BIG: big.url, SMALL: small.url}) == expected
        if expected.startswith("429"):
            assert response.headers["retry-after"] == "1"
            assert _counter(server, "llmfleet_gateway_shed", priority="sheddable") == 1


def test_stale_figures_do_not_count_as_saturated(reporting: dict[str, Sim]) -> None:
    big, small = reporting["busy"], reporting[SMALL]
    clock = FakeClock()
    settings = GatewaySettings(scrape_interval_seconds=3600, metrics_stale_seconds=5)
    app = create_app(settings, discovery=_discovery(big.url, small.url, {}), clock=clock)
    engines = {BIG: big.url, SMALL: small.url}
    with ThreadServer(app) as server:
        table = app.state.table
        _ask(server.url, "critical")  # traffic makes the pool active: its engine is scraped
        wait_for(lambda: table.get(big.url).load, 30, "the one scrape of the big engine")
        assert _served_by(_ask(server.url, "sheddable"), engines) == SMALL
        clock.now += 5.5  # the figures are older than metrics_stale_seconds now
        assert _served_by(_ask(server.url, "sheddable"), engines) == BIG


# --- admission at capacity, and the class of a request -------------------------------------


@pytest.fixture(scope="module")
def slow_and_fast(sim_binary: Path) -> Iterator[tuple[Sim, Sim]]:
    big = Sim(sim_binary, BIG, "--max-num-seqs", "32", "--inter-token-latency", "50ms")
    small = Sim(sim_binary, SMALL)
    try:
        yield big, small
    finally:
        big.kill()
        small.kill()


@pytest.mark.parametrize("degrade", [False, True], ids=["shed", "degrade"])
def test_at_capacity_critical_is_admitted_first_and_sheddable_shed_first(
    slow_and_fast: tuple[Sim, Sim], degrade: bool
) -> None:
    big, small = slow_and_fast
    degradation = {"maxQueueDepth": 100} if degrade else None  # figures never say saturated
    # Capacity 10: sheddable up to 7 in flight, standard up to 9, critical 10.
    with (
        gateway(_discovery(big.url, small.url, degradation), max_in_flight_per_pool=10) as gw,
        httpx.Client(timeout=30) as client,
        ExitStack() as held,
    ):

        def hold(priority: str) -> str:
            """Open a long stream (held until the test ends): who serves it, or the refusal."""
            body = {"model": BIG, "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 1000, "ignore_eos": True, "stream": True}  # fmt: skip
            request = client.build_request(
                "POST", f"{gw.url}/v1/chat/completions", json=body,
                headers={"x-llmfleet-priority": priority},
            )  # fmt: skip
            response = client.send(request, stream=True)
            held.callback(response.close)
            if response.status_code != 200:
                response.read()
                assert response.headers["retry-after"] == "1"
            return _served_by(response, {BIG: big.url, SMALL: small.url})

        assert [hold("standard") for _ in range(6)] == [BIG] * 6
        assert _forwarder(gw).in_flight(BIG, "unified") == 6
        assert hold("sheddable") == BIG  # the 7th
        assert hold("sheddable") == (SMALL if degrade else "429 shed")
        assert [hold("standard"), hold("standard")] == [BIG, BIG]  # the 8th and 9th
        assert hold("standard") == "429 shed"
        assert hold("critical") == BIG  # the 10th
        assert hold("critical") == "429 pool_saturated"  # full: the forwarder's own cap
        sheddable_shed = _counter(gw, "llmfleet_gateway_shed", priority="sheddable")
        assert sheddable_shed == (0 if degrade else 1)
        assert _counter(gw, "llmfleet_gateway_shed", priority="standard") == 1
        assert _counter(gw, "llmfleet_gateway_degraded", to=SMALL) == (1 if degrade else 0)


KEYS = """
tenants:
  ops: {keys: [sk-ops], priority: critical}
  plain: {keys: [sk-plain]}
  batch: {keys: [sk-batch], priority: sheddable}
"""

CLASS_SEEN = {"critical": BIG, "standard": "429 shed", "sheddable": SMALL}
"""How the gateway below shows a request's class: with one of its two slots taken and shares
of one slot, only critical requests reach the big engine, standard ones are refused and
sheddable ones are degraded to the small one."""


@pytest.mark.parametrize(
    ("key", "header", "priority"),
    [
        pytest.param("sk-ops", None, "critical", id="tenant-class"),
        pytest.param("sk-ops", "standard", "standard", id="tenant-lowers-to-standard"),
        pytest.param("sk-ops", "sheddable", "sheddable", id="tenant-lowers-to-sheddable"),
        pytest.param("sk-plain", None, "standard", id="no-class-is-standard"),
        pytest.param("sk-plain", "critical", "standard", id="no-class-cannot-raise"),
        pytest.param("sk-batch", None, "sheddable", id="sheddable-tenant"),
        pytest.param("sk-batch", "critical", "sheddable", id="sheddable-cannot-raise"),
        pytest.param(None, None, "standard", id="no-tenants-standard"),
        pytest.param(None, "critical", "critical", id="no-tenants-header-as-is"),
        pytest.param(None, "sheddable", "sheddable", id="no-tenants-header-lowers"),
    ],
)
def test_the_class_of_a_request(
    slow_and_fast: tuple[Sim, Sim], key: str | None, header: str | None, priority: str
) -> None:
    big, small = slow_and_fast
    settings = GatewaySettings(max_in_flight_per_pool=2, standard_share=0.5, sheddable_share=0.5)
    discovery = _discovery(big.url, small.url, {"maxQueueDepth": 100})
    tenants = Tenants.parse(KEYS) if key else None
    app = create_app(settings, discovery=discovery, tenants=tenants)
    with ThreadServer(app) as server, httpx.Client(timeout=30) as client:
        body = {"model": BIG, "messages": [{"role": "user", "content": "hold"}],
                "max_tokens": 1000, "ignore_eos": True, "stream": True}  # fmt: skip
        headers = {"x-llmfleet-priority": "critical", "authorization": "Bearer sk-ops"}
        url = f"{server.url}/v1/chat/completions"
        with client.stream("POST", url, json=body, headers=headers) as holder:
            assert holder.status_code == 200
            assert _forwarder(server).in_flight(BIG, "unified") == 1
            response = _ask(server.url, header, key, {"max_tokens": 2})
        assert _served_by(response, {BIG: big.url, SMALL: small.url}) == CLASS_SEEN[priority]
