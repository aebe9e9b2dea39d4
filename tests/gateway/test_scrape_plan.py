"""Which engines the scraper reads each tick (`scrape_plan.plan`), as a table; the scraper's
loop over it with a fake clock and a mock transport; and, with real HTTP servers, that an idle
pool gets no GET while an active one is scraped."""

from __future__ import annotations

import asyncio
import math
import threading

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from llmfleet.gateway.discovery import Pool, Service, Split, StaticDiscovery
from llmfleet.gateway.endpoints import EndpointTable, EngineLoad
from llmfleet.gateway.metrics import GatewayMetrics
from llmfleet.gateway.scrape_plan import Schedule, ScrapePlan, next_due
from llmfleet.gateway.scraper import Scraper, known_urls
from llmfleet.gateway.settings import GatewaySettings
from llmfleet.gateway.upstream import HttpxUpstream
from tests.gateway.servers import ThreadServer, gateway, wait_for
from tests.gateway.standin import StandIn

NOW = 100.0
WINDOW = 30.0


def schedule(per_second: float = 1000.0) -> Schedule:
    return Schedule(interval=1.0, active_seconds=WINDOW, per_second=per_second, jitter=0.0,
                    draw=lambda: 0.5)  # fmt: skip


def arrived(urls: list[str], at: float = NOW) -> tuple[Schedule, dict[str, float]]:
    """A schedule whose first scrapes of `urls` started at `at`; their reads stamped then."""
    plan = schedule()
    plan.arrive(urls)
    reads = dict.fromkeys(urls, at)
    assert plan.take(reads, set(), at, slots=100).start == tuple(urls)
    return plan, reads


@pytest.mark.parametrize(
    ("reads", "busy", "at", "slots", "expected"),
    [
        pytest.param({}, set(), NOW + 1, 8, ScrapePlan(), id="no-read-left-nothing-to-do"),
        pytest.param({"a": NOW + 0.5, "b": NOW + 0.5}, set(), NOW + 0.9, 8, ScrapePlan(),
                     id="not-due-yet"),
        pytest.param({"a": NOW + 0.5, "b": NOW + 0.5}, set(), NOW + 1, 8,
                     ScrapePlan(("a", "b"), late=(0.0, 0.0)), id="due-exactly-now"),
        pytest.param({"a": NOW + 0.5, "b": NOW - 0.5}, set(), NOW + 1, 8,
                     ScrapePlan(("a",), late=(0.0,)), id="cold-not-read-since-its-last-scrape"),
        pytest.param({"a": NOW - 31, "b": NOW + 0.5}, set(), NOW + 1, 8,
                     ScrapePlan(("b",), idle=("a",), late=(0.0,)),
                     id="read-before-the-window-is-idle"),
        pytest.param({"a": NOW + 0.5, "b": NOW + 0.5}, {"a"}, NOW + 1.5, 8,
                     ScrapePlan(("b",), late=(0.5,)), id="never-two-scrapes-of-one-endpoint"),
        pytest.param({"a": NOW + 0.5, "b": NOW + 0.5}, set(), NOW + 1, 1,
                     ScrapePlan(("a",), late=(0.0,)), id="bounded-by-the-free-slots"),
        pytest.param({"a": NOW + 0.5, "b": NOW + 0.5}, set(), NOW + 1, -2, ScrapePlan(),
                     id="more-busy-than-the-bound"),
    ],
)  # fmt: skip
def test_take(
    reads: dict[str, float], busy: set[str], at: float, slots: int, expected: ScrapePlan
) -> None:
    """Two endpoints first scraped at NOW (due again at NOW + 1), then read as `reads` says."""
    plan, _ = arrived(["a", "b"])
    assert plan.take(reads, busy, at, slots) == expected


def test_first_reads_go_ahead_of_the_most_overdue() -> None:
    plan, reads = arrived(["late", "later"])
    reads.update({"late": NOW + 0.5, "later": NOW + 0.5, "new": NOW + 2.9})
    plan.arrive(["new"])
    assert plan.take(reads, set(), NOW + 3, slots=2).start == ("new", "late")


def test_a_cold_endpoint_is_scraped_at_its_first_due_time_after_a_read() -> None:
    plan, reads = arrived(["a"])
    for second in (1, 2, 3):  # no read: looked at once a second, never scraped
        assert plan.take(reads, set(), NOW + second, slots=8).start == ()
    reads["a"] = NOW + 3.2
    assert plan.take(reads, set(), NOW + 3.5, slots=8).start == ()  # not due yet
    assert plan.take(reads, set(), NOW + 4, slots=8).start == ("a",)


def test_the_budget_spreads_scrapes_over_time() -> None:
    plan = schedule(per_second=20.0)  # a burst of 2, then one every 50 ms (binary-exact times)
    urls = [f"e{i}" for i in range(6)]
    plan.arrive(urls)
    reads = dict.fromkeys(urls, NOW)
    assert plan.take(reads, set(), NOW, slots=100).start == ("e0", "e1")
    assert plan.take(reads, set(), NOW + 0.0625, slots=100).start == ("e2",)
    assert plan.take(reads, set(), NOW + 0.1875, slots=100).start == ("e3", "e4")


def test_retained_endpoints_only() -> None:
    plan, reads = arrived(["a", "b"])
    plan.retain({"a"})
    assert len(plan) == 1
    reads.update({"a": NOW + 0.5, "b": NOW + 0.5})
    assert plan.take(reads, set(), NOW + 1, slots=8).start == ("a",)


class CountingReads(dict[str, float]):
    looked = 0

    def get(self, key: str, default: object = None) -> object:  # type: ignore[override]
        CountingReads.looked += 1
        return super().get(key, default)


def test_a_tick_looks_only_at_what_is_due() -> None:
    """10,000 active endpoints, one due: the tick reads one endpoint's stamp, not 10,000."""
    urls = [f"e{i}" for i in range(10_000)]
    plan = schedule(per_second=1e9)
    plan.arrive(urls[:1])
    reads = CountingReads(dict.fromkeys(urls, NOW + 0.6))
    plan.take(reads, set(), NOW, slots=100)
    plan.arrive(urls[1:])
    plan.take(reads, set(), NOW + 0.5, slots=100_000)  # the rest: first scrapes
    CountingReads.looked = 0
    assert plan.take(reads, set(), NOW + 1.0, slots=100).start == ("e0",)
    assert CountingReads.looked == 1


@pytest.mark.parametrize(
    ("draw", "expected"),
    [
        pytest.param(0.0, 10.9, id="earliest"),
        pytest.param(0.5, 11.0, id="middle"),
        pytest.param(0.999, 11.1, id="latest"),
    ],
)
def test_next_due_is_an_interval_later_within_the_jitter(draw: float, expected: float) -> None:
    assert math.isclose(next_due(10.0, 1.0, 0.2, draw), expected, abs_tol=1e-3)


def test_known_urls_include_a_canarys_pools() -> None:
    canary = Service("m", "ns", "svc", {"unified": Pool("unified", ("http://c",))}, revision="2")
    stable = Service(
        "m", "ns", "svc", {"unified": Pool("unified", ("http://s1", "http://s2"))},
        canary=Split.of(canary, 10),
    )  # fmt: skip
    other = Service(
        "n", "ns", "pd",
        {"prefill": Pool("prefill", ("http://p",)), "decode": Pool("decode", ("http://d",))},
    )  # fmt: skip
    discovery = StaticDiscovery({"m": stable, "n": other})
    assert known_urls(discovery) == {"http://s1", "http://s2", "http://c", "http://p", "http://d"}


# --- the loop over the plan: fake clock, mock engines ----------------------------------------

METRICS = "vllm:num_requests_waiting 3\nvllm:num_requests_running 2\nvllm:kv_cache_usage_perc 0.5\n"


class FakeClock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


def _pools(*names: str) -> StaticDiscovery:
    pools = {name: Pool("unified", (f"http://{name}-0", f"http://{name}-1")) for name in names}
    return StaticDiscovery(
        {name: Service(name, "ns", name, {"unified": pool}) for name, pool in pools.items()}
    )


async def _settle(scraper: Scraper) -> None:
    """Let the scrapes the last tick started finish (the mock transport answers at once)."""
    for _ in range(20):
        if not scraper._tasks:
            return
        await asyncio.sleep(0)
    raise AssertionError("scrapes still running")


def test_the_scraper_reads_read_pools_once_per_interval_and_forgets_idle_ones() -> None:
    clock = FakeClock()
    got: list[str] = []

    def engine(request: httpx.Request) -> httpx.Response:
        got.append(f"{request.url.scheme}://{request.url.host}")
        return httpx.Response(200, text=METRICS)

    settings = GatewaySettings(
        scrape_interval_seconds=1.0, scrape_active_seconds=30.0, metrics_stale_seconds=5.0
    )
    table = EndpointTable(eject_after_failures=3, eject_seconds=10, stale_seconds=5, clock=clock)
    metrics = GatewayMetrics()

    async def scenario() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(engine)) as client:
            scraper = Scraper(
                HttpxUpstream(client, connect_timeout=1),
                table,
                _pools("a", "b"),
                metrics,
                settings,
                clock=clock,
                draw=lambda: 0.5,
            )
            scraper.retain()
            scraper.tick()
            await _settle(scraper)
            assert got == []  # no traffic yet: not one GET
            table.candidates(["http://a-0", "http://a-1"])  # routing reads pool a
            scraper.tick()
            await _settle(scraper)
            assert sorted(got) == ["http://a-0", "http://a-1"]
            clock.now += 0.1
            assert table.candidates(["http://a-0", "http://a-1"])[0].waiting == 3
            clock.now += 0.4
            scraper.tick()  # not due again yet
            await _settle(scraper)
            assert len(got) == 2
            clock.now += 0.5
            scraper.tick()
            await _settle(scraper)
            assert sorted(got) == ["http://a-0", "http://a-0", "http://a-1", "http://a-1"]
            clock.now += 1  # no read since the last scrape: cold, not scraped again
            scraper.tick()
            await _settle(scraper)
            assert len(got) == 4
            clock.now += 30  # no read since: pool a went idle
            scraper.tick()
            await _settle(scraper)
            assert len(got) == 4
            assert table.reads == {}
            candidate = table.candidates(["http://a-0"])[0]  # traffic is back
            assert (candidate.waiting, candidate.stale) == (0, False)  # unknown, not stale

    asyncio.run(scenario())
    text = metrics.exposition().decode()
    assert 'llmfleet_gateway_scrapes_total{outcome="ok"} 4.0' in text
    assert 'llmfleet_gateway_scrape_endpoints{state="known"} 4.0' in text
    assert "llmfleet_gateway_scrape_lag_seconds_count 2.0" in text  # the two second scrapes


class Switchable(StaticDiscovery):
    """Static discovery whose snapshot a test replaces (a new mapping, as a refresh makes)."""

    def switch(self, other: StaticDiscovery) -> None:
        self._services = dict(other.services())


def test_retain_forgets_the_endpoints_discovery_no_longer_lists() -> None:
    table = EndpointTable(eject_after_failures=3, eject_seconds=10, stale_seconds=5)
    metrics = GatewayMetrics()
    discovery = Switchable(_pools("a", "b").services())

    async def scenario() -> None:
        async with httpx.AsyncClient(
            transport=httpx.MockTransport(lambda _: httpx.Response(503))
        ) as client:
            scraper = Scraper(
                HttpxUpstream(client, connect_timeout=1),
                table,
                discovery,
                metrics,
                GatewaySettings(),
            )
            scraper.retain()
            table.candidates(["http://a-0", "http://b-0"])
            scraper.retain()  # the same snapshot: nothing to walk, nothing forgotten
            assert set(table.reads) == {"http://a-0", "http://b-0"}
            discovery.switch(_pools("a"))
            scraper.retain()
            assert set(table.reads) == {"http://a-0"}

    asyncio.run(scenario())
    assert 'llmfleet_gateway_scrape_endpoints{state="known"} 2.0' in metrics.exposition().decode()


@pytest.mark.parametrize(
    ("answer", "outcome"),
    [
        pytest.param("503", "failed", id="error-status"),
        pytest.param("refused", "failed", id="connect-error"),
        pytest.param("slow", "timeout", id="slower-than-the-timeout"),
        pytest.param("bug", "failed", id="not-an-http-error"),
    ],
)
def test_a_failed_scrape_keeps_the_last_figures_and_is_counted(answer: str, outcome: str) -> None:
    clock = FakeClock()
    fail = False

    async def engine(request: httpx.Request) -> httpx.Response:
        if not fail:
            return httpx.Response(200, text=METRICS)
        if answer == "refused":
            raise httpx.ConnectError("refused", request=request)
        if answer == "slow":
            await asyncio.sleep(5)
        if answer == "bug":
            raise ValueError("not an HTTP error")
        return httpx.Response(503)

    settings = GatewaySettings(scrape_interval_seconds=1.0, scrape_timeout_seconds=0.05)
    table = EndpointTable(eject_after_failures=3, eject_seconds=10, stale_seconds=5, clock=clock)
    metrics = GatewayMetrics()

    async def scenario() -> None:
        nonlocal fail
        async with httpx.AsyncClient(transport=httpx.MockTransport(engine)) as client:
            scraper = Scraper(
                HttpxUpstream(client, connect_timeout=1),
                table,
                _pools("a"),
                metrics,
                settings,
                clock=clock,
            )
            table.candidates(["http://a-0"])
            scraper.tick()
            await _settle(scraper)
            fail = True
            clock.now += 2
            table.candidates(["http://a-0"])  # read since: scraped again
            scraper.tick()
            async with asyncio.timeout(10):
                while scraper._tasks:
                    await asyncio.sleep(0.01)

    asyncio.run(scenario())
    assert table.get("http://a-0").load == EngineLoad(waiting=3, running=2, kv_usage=0.5)
    text = metrics.exposition().decode()
    assert f'llmfleet_gateway_scrapes_total{{outcome="{outcome}"}} 1.0' in text
    assert 'llmfleet_gateway_scrapes_total{outcome="ok"} 1.0' in text


# --- real servers: an idle pool gets no GET ---------------------------------------------------


class CountingEngine(StandIn):
    """A stand-in that also serves /metrics and counts the GETs."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.scrapes = 0
        self._lock = threading.Lock()

    def app(self) -> Starlette:
        app = super().app()
        app.router.routes.append(Route("/metrics", self._metrics, methods=["GET"]))
        return app

    async def _metrics(self, _: Request) -> Response:
        with self._lock:
            self.scrapes += 1
        return PlainTextResponse(METRICS)


def test_an_idle_pool_gets_no_get_while_an_active_one_is_scraped() -> None:
    busy, idle = CountingEngine("busy"), CountingEngine("idle")
    with ThreadServer(busy.app()) as b, ThreadServer(idle.app()) as i:
        discovery = StaticDiscovery(
            {
                name: Service(name, "ns", name, {"unified": Pool("unified", (url,))})
                for name, url in (("busy", b.url), ("idle", i.url))
            }
        )
        with gateway(discovery, scrape_interval_seconds=0.1) as server:
            url = f"{server.url}/v1/chat/completions"
            body = {"model": "busy", "messages": [{"role": "user", "content": "hi"}]}

            def traffic() -> bool | None:
                assert httpx.post(url, json=body, timeout=10).status_code == 200
                return busy.scrapes >= 5 or None

            # Several intervals of the scraper's life, with traffic to one pool all along,
            # seen from the engine it does read.
            wait_for(traffic, 30, "five scrapes of the pool with traffic")
            assert idle.scrapes == 0
            exposition = httpx.get(f"{server.url}/metrics", timeout=10).text
            assert 'llmfleet_gateway_scrape_endpoints{state="known"} 2.0' in exposition
            assert 'llmfleet_gateway_scrape_endpoints{state="active"} 1.0' in exposition
            body["model"] = "idle"
            assert httpx.post(url, json=body, timeout=10).status_code == 200
            wait_for(lambda: idle.scrapes >= 1 or None, 30, "the first scrape of the pool")
