"""The gateway's heap freezes (`gc_pauses`): the start-up heap, again once discovery's first
snapshot is in, so full collections under load do not walk the fleet discovery keeps, and after
a long full collection (`Refreezer`), so they do not walk the state traffic made since."""

from __future__ import annotations

import asyncio
import gc
import http.client
import json
import logging
import threading

import httpx
import pytest
from prometheus_client import CollectorRegistry, Histogram

from llmfleet.core.gc_paused import collector_paused
from llmfleet.gateway.discovery import Pool, Service, StaticDiscovery
from llmfleet.gateway.gc_pauses import (
    PauseRecorder,
    Refreezer,
    became_ready,
    freeze_startup_heap,
)
from tests.gateway.servers import ThreadServer, gateway
from tests.gateway.standin import StandIn
from tests.net import wait_for


@pytest.mark.parametrize(
    ("ready_after", "deadline", "became"),
    [
        pytest.param(0, 1.0, True, id="ready-at-once"),
        pytest.param(3, 1.0, True, id="ready-on-the-third-look"),
        pytest.param(None, 0.05, False, id="never-ready-gives-up-at-the-deadline"),
    ],
)
def test_became_ready(ready_after: int | None, deadline: float, became: bool) -> None:
    looks = 0

    def ready() -> bool:
        nonlocal looks
        looks += 1
        return ready_after is not None and looks > ready_after

    found = asyncio.run(became_ready(ready, every=0.01, deadline=deadline))
    assert found is became
    if ready_after is not None:
        assert looks == ready_after + 1


def test_a_freeze_takes_what_is_alive_out_of_the_collectors_walk() -> None:
    gc.unfreeze()
    try:
        kept = [{"endpoint": str(i)} for i in range(10_000)]
        frozen = freeze_startup_heap()
        assert frozen >= len(kept)
        assert gc.get_count()[0] < 1_000  # the young generation starts empty again
    finally:
        gc.unfreeze()


class _Later(StaticDiscovery):
    """A static discovery whose first snapshot comes only when the test says so."""

    def __init__(self) -> None:
        pool = Pool("unified", ("http://127.0.0.1:9",))
        super().__init__({"m": Service("m", "ns", "svc", {"unified": pool})})
        self.now_ready = False

    def ready(self) -> bool:
        return self.now_ready


def test_the_gateway_freezes_again_once_discovery_is_ready(
    caplog: pytest.LogCaptureFixture,
) -> None:
    discovery = _Later()

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if "discovered fleet" in r.getMessage()]

    try:
        with caplog.at_level(logging.INFO, "llmfleet.gateway"), gateway(discovery) as server:
            assert httpx.get(f"{server.url}/readyz", timeout=5).status_code == 503
            assert said() == []  # not before discovery is ready
            discovery.now_ready = True
            # /readyz says ready only once the fleet's routing state is made and frozen (it
            # held the loop ~100 ms at 1,000 services: no routed request should wait it out)
            wait_for(lambda: httpx.get(f"{server.url}/readyz", timeout=5).status_code == 200
                     or None, 10, "/readyz to say ready")  # fmt: skip
            (line,) = said()
            # the pool's routing state was made before the freeze, no request needed
            state = server.server.config.app.state  # type: ignore[union-attr]
            assert "http://127.0.0.1:9" in state.table._states
            assert ("m", "unified", "") in state.forwarder._schedulers
            exposition = httpx.get(f"{server.url}/metrics", timeout=5).text
        assert "froze" in line
        assert "(1 pools)" in line
        assert 'service="svc"' not in exposition  # its series come with its first request
    finally:
        gc.unfreeze()


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_only_a_full_collection_that_paused_long_asks_for_a_freeze() -> None:
    refreezer = Refreezer(0.01, clock=_Clock())
    refreezer.full_collection(0.009)
    assert not refreezer.due()
    refreezer.full_collection(0.01)
    assert refreezer.due()


def test_a_freeze_takes_the_state_made_since_out_of_the_walk_and_says_so() -> None:
    said: list[float] = []
    refreezer = Refreezer(0.01, on_freeze=said.append)
    gc.unfreeze()
    try:
        freeze_startup_heap()
        state = [[str(i)] for i in range(10_000)]  # made by traffic after start-up
        walked = {id(o) for o in gc.get_objects()}
        assert id(state[0]) in walked
        refreezer.full_collection(0.05)
        assert refreezer.due()
        refreezer.freeze()
        walked = {id(o) for o in gc.get_objects()}
        assert id(state[0]) not in walked
        assert id(state) not in walked
        assert said == [0.05]
        assert not refreezer.due()  # done: the next long collection asks again
    finally:
        gc.unfreeze()


def test_freezes_are_capped_per_hour() -> None:
    clock = _Clock()
    refreezer = Refreezer(0.01, most_per_hour=2, clock=clock)
    gc.unfreeze()
    try:
        for _ in range(2):
            refreezer.full_collection(1.0)
            assert refreezer.due()
            refreezer.freeze()
            clock.now += 60
        refreezer.full_collection(1.0)
        assert not refreezer.due()  # a third within the hour: a heap that keeps churning
        clock.now += 3600
        refreezer.full_collection(1.0)
        assert refreezer.due()  # the first two are an hour old
    finally:
        gc.unfreeze()


def test_the_pause_recorder_hands_full_collections_to_the_refreezer() -> None:
    histogram = Histogram("pauses", "", ("generation",), registry=CollectorRegistry())
    refreezer = Refreezer(0.0)  # every full collection is long enough
    recorder = PauseRecorder(histogram, refreezer)
    recorder.start()
    try:
        gc.collect(1)
        assert not refreezer.due()  # not a full collection
        gc.collect()
        assert refreezer.due()
    finally:
        recorder.stop()


def test_the_gateway_freezes_again_after_a_long_full_collection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With a threshold every full collection passes, the running gateway's refreezer acts on
    the next one (its task looks every second) and counts it."""

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if "froze what it left" in r.getMessage()]

    pool = Pool("unified", ("http://127.0.0.1:9",))
    discovery = StaticDiscovery({"m": Service("m", "ns", "svc", {"unified": pool})})
    try:
        with (
            caplog.at_level(logging.INFO, "llmfleet.gateway"),
            gateway(discovery, refreeze_after_pause_seconds=1e-9) as server,
        ):
            gc.collect()
            lines = wait_for(lambda: said() or None, 10, "a freeze after the collection")
            metrics = httpx.get(f"{server.url}/metrics", timeout=5).text
        counted = next(
            float(line.split()[-1])
            for line in metrics.splitlines()
            if line.startswith("llmfleet_gateway_gc_refreezes_total ")
        )
        assert counted >= len(lines) >= 1
        assert "froze what it left alive too" in lines[0]
    finally:
        gc.unfreeze()


def test_the_collector_is_paused_while_any_thread_is_inside_and_restored_after() -> None:
    assert gc.isenabled()
    entered, release = threading.Event(), threading.Event()

    def render() -> None:
        with collector_paused():
            entered.set()
            release.wait(10)

    other = threading.Thread(target=render)
    other.start()
    try:
        assert entered.wait(10)
        assert not gc.isenabled()
        with collector_paused():  # a second render meanwhile
            assert not gc.isenabled()
        assert not gc.isenabled()  # the first is still inside
    finally:
        release.set()
        other.join(10)
    assert gc.isenabled()


def test_a_collector_disabled_before_stays_disabled() -> None:
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.parametrize(
    ("model", "stream", "status"),
    [
        pytest.param("m", False, 200, id="whole"),
        pytest.param("m", True, 200, id="streamed"),
        pytest.param("nobody-serves-this", False, 404, id="refused"),
    ],
)
def test_a_request_leaves_no_cyclic_garbage(model: str, stream: bool, status: int) -> None:
    """What a request makes is freed by reference counting, so traffic alone does not feed the
    collector's full passes (each a pause of the event loop). Once, the disconnect watcher's
    cancelled task kept its error, whose traceback held a cycle of ~28 objects per request,
    and a streamed call and its stream held each other (`Call.closers`)."""
    requests = 100
    with ThreadServer(StandIn("engine").app()) as engine:
        pool = Pool("unified", (engine.url,))
        discovery = StaticDiscovery({"m": Service("m", "ns", "svc", {"unified": pool})})
        with gateway(discovery, scrape_interval_seconds=3600) as server:
            # http.client, not httpx: httpx's own objects are cycles (~50 a request)
            client = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
            messages = [{"role": "user", "content": "hi"}]
            body = json.dumps({"model": model, "stream": stream, "messages": messages})
            headers = {"content-type": "application/json"}

            def ask() -> None:
                client.request("POST", "/v1/chat/completions", body, headers)
                answer = client.getresponse()
                text = answer.read()
                assert answer.status == status, text

            try:
                for _ in range(20):  # the first requests make the pool's lasting state
                    ask()
                was_enabled = gc.isenabled()
                gc.disable()
                try:
                    gc.collect()
                    for _ in range(requests):
                        ask()
                    found = gc.collect()
                finally:
                    if was_enabled:
                        gc.enable()
            finally:
                client.close()
    # the stand-in and the test share this process: a little slack, far below one a request
    assert found < requests // 4, found


def test_the_refreezer_is_told_a_full_collections_cpu_time_not_its_wall_time() -> None:
    """A collection preempted on a busy machine lasts long on the wall clock, but a freeze
    would not shorten the wait for a CPU: the refreezer weighs the walk's CPU time; both go to
    their histograms."""
    registry = CollectorRegistry()
    wall = Histogram("pauses", "", ("generation",), registry=registry)
    cpu = Histogram("pauses_cpu", "", ("generation",), registry=registry)
    refreezer = Refreezer(0.005)
    ticks = iter(range(1_000_000))
    recorder = PauseRecorder(
        wall, refreezer, cpu_histogram=cpu,
        clock=lambda: next(ticks) * 0.040,  # 40 ms of wall time between start and stop
        cpu_clock=lambda: 0.0,  # and no CPU: the thread waited all along
    )  # fmt: skip
    gc.disable()  # only the collections asked for below
    recorder.start()
    try:
        gc.collect()
    finally:
        recorder.stop()
        gc.enable()
    assert not refreezer.due()
    full = {"generation": "2"}
    assert registry.get_sample_value("pauses_count", full) == 1
    assert registry.get_sample_value("pauses_sum", full) == pytest.approx(0.040)
    assert registry.get_sample_value("pauses_cpu_count", full) == 1
    assert registry.get_sample_value("pauses_cpu_sum", full) == 0

    burning = PauseRecorder(wall, refreezer, cpu_clock=lambda: next(ticks) * 0.040)
    burning.start()
    try:
        gc.collect()
    finally:
        burning.stop()
    assert refreezer.due()  # 40 ms of CPU: the walk itself was long
