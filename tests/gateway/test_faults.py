"""Faults and limits: engines that die, refuse, fail or dawdle; clients that leave; full pools."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import select
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmfleet.crds.policy import LimitsSpec, TrafficSpec
from llmfleet.gateway.app import create_app
from llmfleet.gateway.discovery import Pool, Service, StaticDiscovery
from llmfleet.gateway.settings import GatewaySettings
from tests.gateway.servers import Sim, ThreadServer, free_port, gateway, sims, wait_for
from tests.gateway.standin import StandIn

MODEL = "m"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


def _one_pool(*urls: str, limits: LimitsSpec | None = None) -> StaticDiscovery:
    pool = Pool("unified", tuple(urls))
    return StaticDiscovery(
        {
            MODEL: Service(
                MODEL, "ns", "svc", {"unified": pool}, TrafficSpec(limits=limits or LimitsSpec())
            )
        }
    )


def _counter(server: ThreadServer, name: str) -> float:
    text = httpx.get(f"{server.url}/metrics").text
    pattern = rf"^{name}_total\{{[^}}]*\}} (\S+)$"
    return sum(float(value) for value in re.findall(pattern, text, re.MULTILINE))


UPSTREAMS = pytest.mark.parametrize("upstream", ["wire", "aiohttp", "httpx"])
"""The fault tests run over both upstream clients: their errors must mean the same."""


@UPSTREAMS
def test_engine_killed_mid_stream_ends_the_stream_with_an_error_event(
    sim_binary: Path, upstream: str
) -> None:
    sim = Sim(sim_binary, MODEL, "--inter-token-latency", "200ms")
    try:
        with gateway(_one_pool(sim.url), upstream_client=upstream) as server:
            body = {**BODY, "max_tokens": 100, "stream": True, "ignore_eos": True}
            # the timeout is the no-hang guard: a hang fails the test with ReadTimeout
            with httpx.stream(
                "POST", f"{server.url}/v1/chat/completions", json=body, timeout=10
            ) as response:
                lines = response.iter_lines()
                assert next(lines).startswith("data: ")
                sim.kill()
                rest = [line for line in lines if line]
    finally:
        sim.kill()
    assert rest, "the stream ended without a word"
    assert rest[-1].startswith('data: {"error"')
    assert "failed mid-stream" in rest[-1]
    assert "[DONE]" not in "".join(rest)


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param("refused", id="connection-refused"),
        pytest.param("500", id="5xx-before-first-token"),
    ],
)
@UPSTREAMS
def test_failing_endpoint_is_retried_elsewhere_then_ejected(bad: str, upstream: str) -> None:
    good = StandIn("good")
    failing = StandIn("bad", status=500)
    with ThreadServer(good.app()) as g, ThreadServer(failing.app()) as f:
        bad_url = f"http://127.0.0.1:{free_port()}" if bad == "refused" else f.url
        # round-robin: every other first try lands on the bad endpoint
        with gateway(
            _one_pool(bad_url, g.url),
            profile="round-robin",
            eject_after_failures=2,
            upstream_client=upstream,
        ) as server:
            statuses = [
                httpx.post(f"{server.url}/v1/chat/completions", json=BODY, timeout=10).status_code
                for _ in range(6)
            ]
            retries = _counter(server, "llmfleet_gateway_retries")
            ejections = _counter(server, "llmfleet_gateway_ejections")
    assert statuses == [200] * 6
    assert retries == 2  # two failures, then the bad endpoint is out of rotation
    assert ejections == 1
    assert len(good.received) == 6


def test_no_endpoint_reachable_is_a_retryable_503_naming_them() -> None:
    dead = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]  # nothing listens: refused
    with gateway(_one_pool(*dead)) as server:
        response = httpx.post(f"{server.url}/v1/chat/completions", json=BODY, timeout=10)
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("service_unavailable", "upstream_unreachable")
    assert all(url in error["message"] for url in dead)


def test_an_engine_that_failed_the_request_makes_it_a_502_naming_them() -> None:
    """First an engine answers 500, then the retry finds nothing listening: not a 503, as an
    engine did see the request (round-robin tries the pool's endpoints in order)."""
    dead = f"http://127.0.0.1:{free_port()}"
    with (
        ThreadServer(StandIn("bad", status=500).app()) as failing,
        gateway(_one_pool(failing.url, dead), profile="round-robin") as server,
    ):
        response = httpx.post(f"{server.url}/v1/chat/completions", json=BODY, timeout=10)
    assert response.status_code == 502
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("upstream_error", "upstream_unavailable")
    assert f"{failing.url}: status 500" in error["message"]
    assert dead in error["message"]


@contextlib.contextmanager
def _unanswered_connects() -> Iterator[str]:
    """A loopback address whose connects time out: a listening socket that never accepts, its
    accept queue filled first (Linux then drops further SYNs, so the client waits for its
    connect timeout, as for an engine on a saturated or unreachable node)."""
    listener = socket.socket()
    fillers: list[socket.socket] = []
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        address = listener.getsockname()
        while True:  # fill the accept queue until a connect no longer completes
            filler = socket.socket()
            filler.setblocking(False)
            fillers.append(filler)
            filler.connect_ex(address)
            _, writable, _ = select.select([], [filler], [], 0.5)
            if not writable:
                break
            assert len(fillers) < 64, "the accept queue never filled"
        yield f"http://127.0.0.1:{address[1]}"
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


@UPSTREAMS
def test_a_connect_timeout_with_no_endpoint_left_is_a_retryable_503(upstream: str) -> None:
    with (
        _unanswered_connects() as silent,
        gateway(_one_pool(silent), connect_timeout_seconds=0.3, upstream_client=upstream) as gw,
    ):
        response = httpx.post(f"{gw.url}/v1/chat/completions", json=BODY, timeout=10)
    assert response.status_code == 503, response.text
    assert response.headers["retry-after"] == "1"
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("service_unavailable", "upstream_unreachable")
    assert silent in error["message"]


@UPSTREAMS
def test_client_disconnect_reaches_the_engine(upstream: str) -> None:
    engine = StandIn("slow", chunks=200, chunk_interval=0.05)
    with (
        ThreadServer(engine.app()) as e,
        gateway(_one_pool(e.url), upstream_client=upstream) as server,
    ):
        body = {**BODY, "stream": True}
        with httpx.stream(
            "POST", f"{server.url}/v1/chat/completions", json=body, timeout=10
        ) as response:
            # NOTE: keep the iterator; an abandoned one is collected and closes the connection
            lines = response.iter_lines()
            events = [next(lines) for _ in range(6)]  # three events, each ends with a blank line
            assert [line[:6] for line in events] == ["data: ", ""] * 3
            assert not engine.client_left.is_set()
        # leaving the block closed the connection mid-stream
        wait_for(lambda: engine.client_left.is_set() or None, 30, "the engine to see the client go")
        table = server.server.config.app.state.table  # type: ignore[attr-defined]
        wait_for(lambda: table.get(e.url).in_flight == 0 or None, 30, "in-flight to drop to 0")


@UPSTREAMS
def test_client_leaving_before_a_non_streaming_answer_cancels_it_upstream(upstream: str) -> None:
    engine = StandIn("slow", delay=5.0)
    with (
        ThreadServer(engine.app()) as e,
        gateway(_one_pool(e.url), upstream_client=upstream) as server,
    ):
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{server.url}/v1/chat/completions", json=BODY, timeout=0.5)
        # well before the engine's 5 s answer: the gateway closed the upstream connection
        wait_for(lambda: engine.client_left.is_set() or None, 30, "the engine to see the client go")
        table = server.server.config.app.state.table  # type: ignore[attr-defined]
        wait_for(lambda: table.get(e.url).in_flight == 0 or None, 30, "in-flight to drop to 0")
        # counted when the request's task ends, which may follow the in-flight release
        wait_for(
            lambda: 'outcome="cancelled"' in httpx.get(f"{server.url}/metrics").text or None,
            10, "the cancelled outcome counted",
        )  # fmt: skip


def test_full_pool_answers_429_with_retry_after() -> None:
    engine = StandIn("slow", chunks=40, chunk_interval=0.05)
    with (
        ThreadServer(engine.app()) as e,
        gateway(_one_pool(e.url), max_in_flight_per_pool=1, retry_after_seconds=3) as server,
    ):
        url = f"{server.url}/v1/chat/completions"
        with httpx.stream("POST", url, json={**BODY, "stream": True}, timeout=10) as held:
            lines = held.iter_lines()  # held open: an abandoned iterator would close it
            assert next(lines).startswith("data: ")
            refused = httpx.post(url, json=BODY, timeout=10)
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "3"
        assert refused.json()["error"]["code"] == "pool_saturated"
        assert _counter(server, "llmfleet_gateway_rejected") == 1


@UPSTREAMS
def test_service_timeout_is_a_504(upstream: str) -> None:
    engine = StandIn("stuck", delay=2.0)
    with (
        ThreadServer(engine.app()) as e,
        gateway(
            _one_pool(e.url, limits=LimitsSpec(timeout_seconds=0.3)), upstream_client=upstream
        ) as server,
    ):
        response = httpx.post(f"{server.url}/v1/chat/completions", json=BODY, timeout=10)
    assert response.status_code == 504
    assert response.json()["error"]["type"] == "timeout_error"


@pytest.mark.parametrize(
    ("service_cap", "gateway_cap", "asked", "sent"),
    [
        pytest.param(5, None, 100, 5, id="service-cap-lowers"),
        pytest.param(5, None, None, 5, id="service-cap-fills-in"),
        pytest.param(500, None, 100, 100, id="under-the-cap-unchanged"),
        pytest.param(None, 7, 100, 7, id="gateway-cap"),
        pytest.param(None, None, None, None, id="no-cap"),
    ],
)
def test_max_token_cap(
    service_cap: int | None, gateway_cap: int | None, asked: int | None, sent: int | None
) -> None:
    engine = StandIn("e")
    body = BODY if asked is None else {**BODY, "max_tokens": asked}
    with ThreadServer(engine.app()) as e:
        discovery = _one_pool(e.url, limits=LimitsSpec(max_tokens=service_cap))
        with gateway(discovery, max_tokens=gateway_cap) as server:
            response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=10)
    assert response.status_code == 200
    assert engine.received[0].get("max_tokens") == sent


@pytest.mark.parametrize("timeout", [None, 30.0], ids=["plain", "deadline-wrapped"])
def test_a_stream_never_sent_is_still_closed_and_accounted(timeout: float | None) -> None:
    """The client is gone before the response starts (the server's first `send` fails), so
    nothing ever iterates the body, however the policies wrapped it: the engine's stream is
    closed all the same (the engine sees its client leave) and the in-flight counts drop."""
    engine = StandIn("e", chunks=200, chunk_interval=0.05)
    with ThreadServer(engine.app()) as e:
        app = create_app(
            GatewaySettings(),
            discovery=_one_pool(e.url, limits=LimitsSpec(timeout_seconds=timeout)),
        )
        body = json.dumps({**BODY, "stream": True}).encode()

        async def run() -> None:
            messages = [{"type": "http.request", "body": body, "more_body": False}]

            async def receive() -> dict[str, Any]:
                if messages:
                    return messages.pop()
                await asyncio.sleep(3600)  # never a disconnect: the send below fails first
                return {}

            async def send(message: dict[str, Any]) -> None:
                if message["type"] == "http.response.start":
                    raise OSError("connection reset by peer")

            scope = {
                "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                "method": "POST", "path": "/v1/chat/completions", "raw_path": b"",
                "query_string": b"", "headers": [(b"content-type", b"application/json")],
                "scheme": "http", "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1),
                "root_path": "",
            }  # fmt: skip
            try:
                with contextlib.suppress(OSError):
                    await app(scope, receive, send)
                assert app.state.table.get(e.url).in_flight == 0
            finally:  # no lifespan ran here: close the engines' connection pool ourselves
                await app.state.forwarder.upstream.aclose()

        asyncio.run(run())
        assert engine.client_left.wait(5), "the engine never saw its client leave"


def test_an_engine_stopped_with_sigstop_is_ejected_after_its_timeouts(sim_binary: Path) -> None:
    """A hung engine (SIGSTOP: the kernel still accepts connections, nothing answers) is a
    failure at each read timeout: after `eject_after_failures` of them it is ejected and the
    traffic moves to the other engine. Its last scraped figures stay fresh (they make it look
    idle, as in production), so only the ejection can move the traffic; round-robin sends every
    other request to it until then."""
    eject_after = 2
    with (
        sims(sim_binary, MODEL, 2) as (stopped, healthy),
        gateway(
            _one_pool(stopped.url, healthy.url),
            profile="round-robin",
            request_timeout_seconds=1.0,
            eject_after_failures=eject_after,
            eject_seconds=600,
            metrics_stale_seconds=600,
        ) as server,
    ):
        table = server.server.config.app.state.table  # type: ignore[attr-defined]
        url = f"{server.url}/v1/chat/completions"
        # Only pools with traffic are scraped: one request makes this one active.
        assert httpx.post(url, json=BODY, timeout=10).status_code == 200
        wait_for(
            lambda: all(table.get(s.url).load is not None for s in (stopped, healthy)) or None,
            30,
            "both engines scraped",
        )
        stopped.process.send_signal(signal.SIGSTOP)
        try:
            timeouts = 0
            for _ in range(2 * eject_after):
                if _counter(server, "llmfleet_gateway_ejections") >= 1:
                    break
                response = httpx.post(url, json=BODY, timeout=10)
                if response.status_code == 504:
                    timeouts += 1
                else:  # served by the healthy engine (a retry elsewhere is allowed)
                    assert response.status_code == 200, response.text
                    assert response.headers["x-llmfleet-endpoint"] == healthy.url
            assert _counter(server, "llmfleet_gateway_ejections") == 1
            assert timeouts <= eject_after
            after = [httpx.post(url, json=BODY, timeout=10) for _ in range(6)]
            assert [r.status_code for r in after] == [200] * 6
            assert {r.headers["x-llmfleet-endpoint"] for r in after} == {healthy.url}
        finally:
            stopped.process.send_signal(signal.SIGCONT)
