"""/metrics rendered in paced slices (`metrics.Pace`): the same bytes as prometheus_client's own
rendering, with the render thread asleep between slices, so the event loop keeps the GIL."""

from __future__ import annotations

import httpx
import prometheus_client
import pytest
from fastapi import FastAPI

from llmfleet.gateway import app as app_module
from llmfleet.gateway import metrics as metrics_module
from llmfleet.gateway.metrics import GatewayMetrics, Pace
from llmfleet.gateway.pool_metrics import PoolSeries
from tests.gateway.servers import ThreadServer


def _fleet_metrics(pools: int) -> GatewayMetrics:
    """Metrics with `pools` pools' children, each having served a request."""
    found = GatewayMetrics(discovered=lambda: {})
    for index in range(pools):
        pool = found.pool(("ns", f"svc-{index}", "unified", f"model-{index}", ""))
        pool.count_outcome("ok")
        pool.observe_e2e(0.2)
        pool.observe_ttft(0.05)
    return found


def test_a_paced_render_is_byte_for_byte_the_plain_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics_module.time, "sleep", lambda _: None)
    found = _fleet_metrics(50)
    assert found.exposition(Pace(work_seconds=0)) == found.exposition()


@pytest.mark.parametrize("created", [True, False])
def test_a_render_in_small_pieces_of_text_is_the_plain_one(
    monkeypatch: pytest.MonkeyPatch, created: bool
) -> None:
    """Formatted a few samples at a time (a family's later pieces without its header), with
    and without the `_created` samples the gateway turns off (`server.serve`), which
    prometheus_client lists after a family's others: the same bytes."""
    monkeypatch.setattr(metrics_module.time, "sleep", lambda _: None)
    # the process-wide switch behind `disable_created_metrics`, restored after the test
    monkeypatch.setattr(prometheus_client.metrics, "_use_created", created)
    found = _fleet_metrics(20)
    plain = found.exposition()
    for size in (1, 7, 1024):
        assert found.exposition(Pace(work_seconds=0, text_samples=size)) == plain
    assert (b"_created" in plain) is created


def test_the_render_sleeps_between_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no work allowed per slice, it pauses at every look at the clock: every
    `check_every` samples of a family as they are made (a labelled metric's own `collect()`
    would make them all at once, 45-65 ms at 1,000 pools) and as they are rendered, and after
    each family; the per-pool series (`PoolSeries.pieces`) after each pool in each family."""
    slept: list[float] = []
    monkeypatch.setattr(metrics_module.time, "sleep", slept.append)
    found = _fleet_metrics(50)
    families = list(found.registry.collect())
    per_pool = {family.name for family in PoolSeries().describe()}
    others = [f for f in families if f.name not in per_pool]
    # the per-pool series: after each pool in each family, and once after their text
    looks = sum(2 * (len(f.samples) // 16) + 1 for f in others) + len(per_pool) * 50 + 1
    found.exposition(Pace(work_seconds=0, pause_seconds=0.002, check_every=16))
    assert len(slept) == looks
    assert set(slept) == {0.002}
    slept.clear()
    found.exposition(Pace(work_seconds=3600, check_every=16))  # one slice: no pause
    assert slept == []


def test_the_render_comes_in_chunks_that_join_into_the_plain_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Never one buffer of the whole exposition (at 1,000 pools a 4-5 ms join that held the
    event loop): chunks of at least `chunk_bytes` (the last may be less), in order."""
    monkeypatch.setattr(metrics_module.time, "sleep", lambda _: None)
    found = _fleet_metrics(50)
    plain = found.exposition()
    chunks = found.exposition_chunks(Pace(work_seconds=0, chunk_bytes=4096))
    assert b"".join(chunks) == plain
    assert len(chunks) > 5
    assert all(len(chunk) >= 4096 for chunk in chunks[:-1])
    assert found.exposition_chunks(Pace(work_seconds=0), ["llmfleet_gateway_requests"]) == [
        found.exposition(names=["llmfleet_gateway_requests"])
    ]


def test_metrics_route_sends_the_chunks_as_one_body(monkeypatch: pytest.MonkeyPatch) -> None:
    """/metrics over HTTP: the chunks one after another, with the whole body's length."""
    monkeypatch.setattr(metrics_module.time, "sleep", lambda _: None)
    monkeypatch.setattr(app_module, "PACE", Pace(work_seconds=0, chunk_bytes=4096))
    found = _fleet_metrics(50)
    app = FastAPI()
    app_module._metrics_route(app, found)
    with ThreadServer(app) as served, httpx.Client(base_url=served.url) as client:
        answer = client.get("/metrics")
        one = client.get("/metrics", params={"name[]": "llmfleet_gateway_requests"})
    assert answer.status_code == 200
    assert answer.content == found.exposition()
    assert int(answer.headers["content-length"]) == len(answer.content)
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert one.content == found.exposition(names=["llmfleet_gateway_requests"])
