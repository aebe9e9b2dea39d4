"""The per-pool series (`pool_metrics`): prometheus_client's exposition for the same
observations, line for line, at a fraction of the objects the garbage collector walks; and
/metrics?name[]= for a poll of one family."""

from __future__ import annotations

import gc
import random

import httpx
import prometheus_client
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.utils import floatToGoString

from llmfleet.gateway import pool_metrics
from llmfleet.gateway.discovery import Pool, Service, Split, StaticDiscovery
from llmfleet.gateway.metrics import GatewayMetrics
from llmfleet.gateway.pool_metrics import LABELS, PoolSeries
from tests.gateway.servers import ThreadServer, gateway
from tests.gateway.standin import StandIn

OUTCOMES = ("ok", "client_error", "upstream_error", "timeout", "cancelled")


def _reference(registry: CollectorRegistry) -> dict[str, object]:
    """prometheus_client's own metrics with the names, help and buckets of the pool series."""
    help = {family.name: family.documentation for family in PoolSeries().describe()}
    made: dict[str, object] = {}
    made["requests"] = Counter("llmfleet_gateway_requests", help["llmfleet_gateway_requests"],
                               (*LABELS, "outcome"), registry=registry)  # fmt: skip
    for key, name, buckets in (
        ("e2e", "llmfleet_gateway_request_duration_seconds", pool_metrics.LATENCY_BUCKETS),
        ("ttft", "llmfleet_gateway_time_to_first_token_seconds", pool_metrics.LATENCY_BUCKETS),
        ("itl", "llmfleet_gateway_inter_token_latency_seconds", pool_metrics.ITL_BUCKETS),
    ):
        made[key] = Histogram(name, help[name], LABELS, buckets=buckets, registry=registry)
    for key in ("retries", "ejections", "rejected"):
        name = f"llmfleet_gateway_{key}"
        made[key] = Counter(name, help[name], LABELS, registry=registry)
    name = "llmfleet_gateway_in_flight_requests"
    made["in_flight"] = Gauge(name, help[name], LABELS, registry=registry)
    return made


def test_the_series_are_prometheus_clients_for_the_same_observations(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Random observations, bucket bounds exactly, values past the last bound, in-flight up
    and down, over 30 pools: the same lines as Counter, Histogram and Gauge give (no `_created`
    series, as the gateway runs: `server.serve`)."""
    monkeypatch.setattr(prometheus_client.metrics, "_use_created", False)
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    series = PoolSeries()
    ours.register(series)
    ref = _reference(theirs)
    draw = random.Random(7)
    values = [*pool_metrics.LATENCY_BUCKETS, *pool_metrics.ITL_BUCKETS, 0.0, 301.0, 1e9, 2e6]
    for _ in range(3000):
        # label values with what the text format escapes: \\, a newline, "
        labels = ("ns", f"svc-{draw.randrange(30)}", draw.choice(("unified", "decode")),
                  draw.choice(("m", 'org\\m "q"\nx')), draw.choice(("", "abc")))  # fmt: skip
        pool = series.pool(labels)
        value = draw.choice(values) if draw.random() < 0.3 else draw.expovariate(2.0)
        match draw.randrange(9):
            case 0:
                outcome = draw.choice(OUTCOMES)
                pool.count_outcome(outcome)
                ref["requests"].labels(*labels, outcome).inc()  # type: ignore[attr-defined]
            case 1:
                pool.observe_e2e(value)
                ref["e2e"].labels(*labels).observe(value)  # type: ignore[attr-defined]
            case 2:
                pool.observe_ttft(value)
                ref["ttft"].labels(*labels).observe(value)  # type: ignore[attr-defined]
            case 3:
                pool.observe_itl(value / 100)
                ref["itl"].labels(*labels).observe(value / 100)  # type: ignore[attr-defined]
            case 4:
                pool.count_retry()
                ref["retries"].labels(*labels).inc()  # type: ignore[attr-defined]
            case 5:
                pool.count_ejection()
                ref["ejections"].labels(*labels).inc()  # type: ignore[attr-defined]
            case 6:
                pool.count_rejected()
                ref["rejected"].labels(*labels).inc()  # type: ignore[attr-defined]
            case _:
                change = draw.choice((1, -1))
                pool.add_in_flight(change)
                ref["in_flight"].labels(*labels).inc(change)  # type: ignore[attr-defined]
    # prometheus_client makes a labelled metric's children when first asked for them: make
    # every pool's, as a pool here has all its series from its first request
    for labels in series._pools:
        for key in ("e2e", "ttft", "itl", "retries", "ejections", "rejected", "in_flight"):
            ref[key].labels(*labels)  # type: ignore[attr-defined]
    text, reference = generate_latest(ours), generate_latest(theirs)
    # the same lines; the same families in the same order (series within a family may come
    # in another order: prometheus_client lists a family's children as each was first made)
    assert sorted(text.splitlines()) == sorted(reference.splitlines())
    assert _headers(text) == _headers(reference)
    assert text.count(b"_bucket{") > 30 * 2 * 3  # the comparison saw every family filled
    # and the text /metrics writes straight from the figures (`PoolSeries.text`) is that text
    assert series.text(lambda: None, 1) == text


def _headers(text: bytes) -> list[bytes]:
    return [line for line in text.splitlines() if line.startswith(b"#")]


def test_an_empty_series_is_its_families_headers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prometheus_client.metrics, "_use_created", False)
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    ours.register(PoolSeries())
    _reference(theirs)
    assert generate_latest(ours) == generate_latest(theirs)


def test_a_pool_is_two_objects_the_collector_tracks() -> None:
    """prometheus_client's children were ~120 tracked objects per pool (a value and a lock per
    bucket): what full collections walked while traffic spread over 1,000 pools."""
    metrics = GatewayMetrics()
    gc.collect()
    before = len(gc.get_objects())
    for index in range(200):
        pool = metrics.pool(("ns", f"svc-{index}", "unified", "m", ""))
        for outcome in OUTCOMES:
            pool.count_outcome(outcome)
        pool.observe_e2e(0.2)
        pool.observe_ttft(0.05)
        pool.observe_itl(0.01)
        pool.count_retry()
        pool.add_in_flight(1)
    gc.collect()
    assert (len(gc.get_objects()) - before) / 200 <= 2.1


def test_metrics_by_name_answers_only_those_families() -> None:
    """/metrics?name[]=...: what a benchmark's poll of one figure reads, not every pool's
    series (the whole exposition is megabytes at 1,000 pools)."""
    engine = StandIn("engine")
    with ThreadServer(engine.app()) as served:
        discovery = StaticDiscovery(
            {"m": Service("m", "ns", "m", {"unified": Pool("unified", (served.url,))})}
        )
        with gateway(discovery) as server, httpx.Client(base_url=server.url) as client:
            answer = client.post(
                "/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            )
            assert answer.status_code == 200
            whole = client.get("/metrics").text
            one = client.get(
                "/metrics", params={"name[]": "llmfleet_gateway_discovered_endpoints"}
            ).text
            two = client.get(
                "/metrics",
                params=[
                    ("name[]", "llmfleet_gateway_discovered_services"),
                    ("name[]", "llmfleet_gateway_requests_total"),
                ],
            ).text
    assert "llmfleet_gateway_request_duration_seconds_bucket" in whole
    assert [line for line in one.splitlines() if not line.startswith("#")] == [
        'llmfleet_gateway_discovered_endpoints{role="unified"} 1.0'
    ]
    samples = [line.split("{")[0].split(" ")[0] for line in two.splitlines()
               if not line.startswith("#")]  # fmt: skip
    assert sorted(set(samples)) == [
        "llmfleet_gateway_discovered_services",
        "llmfleet_gateway_requests_total",
    ]


@pytest.mark.parametrize(
    "value", [0.0, -0.0, 1.0, -3.0, 999999.0, 1e6, 1234567.0, 1e16, -1e16, 0.25, 1e-7, 2e6 + 0.5,
              float("inf"), float("nan")],
)  # fmt: skip
def test_a_value_is_written_as_prometheus_client_writes_it(value: float) -> None:
    assert pool_metrics._go(value) == floatToGoString(value)  # type: ignore[no-untyped-call]


def test_forget_keeps_a_pool_with_a_request_in_flight() -> None:
    series = PoolSeries()
    gone, busy, kept = (("ns", name, "unified", name, "") for name in ("gone", "busy", "kept"))
    series.pool(gone).count_outcome("ok")
    series.pool(busy).add_in_flight(1)
    series.pool(kept).count_outcome("ok")
    assert series.forget(lambda labels: labels[1] != "kept") == 1
    text = series.text(lambda: None, 100).decode()
    assert 'service="gone"' not in text
    assert 'service="busy"' in text  # its request still counts when it ends
    series.pool(busy).add_in_flight(-1)
    assert series.forget(lambda labels: labels[1] != "kept") == 1
    assert 'service="busy"' not in series.text(lambda: None, 100).decode()
    assert 'service="kept"' in series.text(lambda: None, 100).decode()


class _Swapped(StaticDiscovery):
    """A static discovery whose snapshot the test replaces (a new object, as discovery's)."""

    def swap(self, services: dict[str, Service]) -> None:
        self._services = dict(services)


def test_a_deleted_services_series_end_at_the_next_metrics_read() -> None:
    with ThreadServer(StandIn("engine").app()) as engine:
        pool = Pool("unified", (engine.url,))
        services = {name: Service(name, "ns", f"svc-{name}", {"unified": pool})
                    for name in ("a", "b")}  # fmt: skip
        discovery = _Swapped(services)
        with gateway(discovery) as server, httpx.Client(timeout=10) as client:
            for model in ("a", "b"):
                answer = client.post(f"{server.url}/v1/chat/completions", json={
                    "model": model, "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
                assert answer.status_code == 200, answer.text
            text = client.get(f"{server.url}/metrics").text
            assert 'service="svc-a"' in text
            assert 'service="svc-b"' in text
            discovery.swap({"b": services["b"]})
            text = client.get(f"{server.url}/metrics").text
            assert 'service="svc-a"' not in text
            assert 'llmfleet_gateway_requests_total{model="b",namespace="ns",outcome="ok"' in text
            again = client.get(f"{server.url}/metrics").text  # an unchanged snapshot: as it was
            assert 'service="svc-b"' in again


def test_a_revision_a_rollout_left_behind_has_its_series_end() -> None:
    """A canary's promotion changes the service's revision: the old revision's series end at
    the next /metrics read; the stable and canary revisions of a rollout in progress stay
    while other services change."""
    with ThreadServer(StandIn("engine").app()) as engine:
        pool = Pool("unified", (engine.url,))

        def stable(revision: str, canary: str | None = None) -> Service:
            split = None
            if canary is not None:
                split = Split.of(Service("a", "ns", "svc-a", {"unified": pool}, revision=canary),
                                 100)  # fmt: skip
            return Service("a", "ns", "svc-a", {"unified": pool}, revision=revision,
                           canary=split)  # fmt: skip

        discovery = _Swapped({"a": stable("r1")})
        with gateway(discovery) as server, httpx.Client(timeout=10) as client:

            def ask() -> str:
                answer = client.post(f"{server.url}/v1/chat/completions", json={
                    "model": "a", "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
                assert answer.status_code == 200, answer.text
                return answer.headers["x-llmfleet-revision"]

            assert ask() == "r1"
            discovery.swap({"a": stable("r1", canary="r2")})  # a rollout starts
            assert ask() == "r2"
            text = client.get(f"{server.url}/metrics").text
            assert 'revision="r1"' in text
            assert 'revision="r2"' in text
            other = Service("b", "ns", "svc-b", {"unified": pool})
            discovery.swap({"a": stable("r1", canary="r2"), "b": other})  # another change
            text = client.get(f"{server.url}/metrics").text
            assert 'revision="r1"' in text
            assert 'revision="r2"' in text
            discovery.swap({"a": stable("r2"), "b": other})  # promoted
            text = client.get(f"{server.url}/metrics").text
            assert 'revision="r1"' not in text
            assert 'revision="r2"' in text


def test_every_series_of_a_pool_is_written_from_its_first_request() -> None:
    """A pool that has not streamed yet still has its TTFT and ITL series, at zero: Prometheus's
    `rate()` needs that sample before the first increase."""
    series = PoolSeries()
    series.pool(("ns", "w", "unified", "w", "")).observe_e2e(0.2)
    text = series.text(lambda: None, 1).decode()
    assert text == generate_latest_of(series)
    for family in ("time_to_first_token_seconds", "inter_token_latency_seconds"):
        assert f'llmfleet_gateway_{family}_count{{model="w",' in text


def generate_latest_of(series: PoolSeries) -> str:
    registry = CollectorRegistry()
    registry.register(series)
    return generate_latest(registry).decode()
