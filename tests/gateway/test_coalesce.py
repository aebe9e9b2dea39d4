"""`traffic.coalesce`: identical requests of one tenant share one upstream call.

Engines: llm-d-inference-sim wherever the test counts upstream requests (its
`vllm:request_success_total`) and compares answers (random text: uncoalesced answers differ);
the stand-in (`standin.py`) where the test must see the engine's client leave, which the
simulator does not report, or must hold a failing answer while both callers wait.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.responses import Response

from llmfleet.crds.policy import CoalesceSpec, TrafficSpec
from llmfleet.gateway.app import create_app
from llmfleet.gateway.discovery import Pool, Service, StaticDiscovery
from llmfleet.gateway.endpoints import EndpointTable
from llmfleet.gateway.metrics import GatewayMetrics
from llmfleet.gateway.openai_request import parse
from llmfleet.gateway.policies.base import PolicyDeps
from llmfleet.gateway.policies.coalesce import Coalescer
from llmfleet.gateway.proxy import Call, Forwarder
from llmfleet.gateway.routing.base import RoutingRequest
from llmfleet.gateway.settings import GatewaySettings
from tests.gateway.servers import Sim, ThreadServer, gateway
from tests.gateway.standin import StandIn
from tests.net import wait_for

MODEL = "m"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 12}
GREEDY = {**CHAT, "temperature": 0}
COALESCED = "x-llmfleet-coalesced"


def _service(url: str, coalesce: CoalesceSpec | None = None) -> StaticDiscovery:
    spec = coalesce if coalesce is not None else CoalesceSpec(enabled=True)
    pool = Pool("unified", (url,))
    return StaticDiscovery(
        {MODEL: Service(MODEL, "ns", "svc", {"unified": pool}, TrafficSpec(coalesce=spec))}
    )


def _served(sim: Sim) -> float:
    """Requests the simulator answered in full."""
    text = httpx.get(f"{sim.url}/metrics").text
    pattern = r"^vllm:request_success_total(?:\{[^}]*\})? (\S+)$"
    return sum(float(value) for value in re.findall(pattern, text, re.MULTILINE))


def _counter(server: ThreadServer, name: str, **labels: str) -> float:
    text = httpx.get(f"{server.url}/metrics").text
    total = 0.0
    for series, value in re.findall(rf"^{name}_total\{{([^}}]*)\}} (\S+)$", text, re.MULTILINE):
        if all(f'{key}="{wanted}"' in series for key, wanted in labels.items()):
            total += float(value)
    return total


def _gauge(server: ThreadServer, name: str) -> float:
    text = httpx.get(f"{server.url}/metrics").text
    pattern = rf"^{name}(?:\{{[^}}]*\}})? (\S+)$"
    return sum(float(value) for value in re.findall(pattern, text, re.MULTILINE))


def _settle(sim: Sim, expected: float) -> float:
    """The simulator's count once it reached `expected` (or, failing that, what it says)."""
    try:
        return wait_for(lambda: _served(sim) if _served(sim) >= expected else None, 30, "counts")
    except AssertionError:
        return _served(sim)


async def _post_all(
    url: str, bodies: list[dict[str, Any]], headers: list[dict[str, str]]
) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=len(bodies))
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        calls = [client.post(url, json=b, headers=h) for b, h in zip(bodies, headers, strict=True)]
        return list(await asyncio.gather(*calls))


async def _stream_all(
    url: str, body: dict[str, Any], count: int
) -> list[tuple[httpx.Response, bytes]]:
    limits = httpx.Limits(max_connections=count)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:

        async def one(i: int) -> tuple[httpx.Response, bytes]:
            headers = {"x-request-id": f"r{i}"}
            async with client.stream("POST", url, json=body, headers=headers) as response:
                return response, b"".join([chunk async for chunk in response.aiter_raw()])

        return list(await asyncio.gather(*(one(i) for i in range(count))))


@pytest.fixture(scope="module")
def slow_sim(sim_binary: Path) -> Iterator[Sim]:
    """Answers after 1.5 s: identical requests sent together all arrive while it works."""
    sim = Sim(sim_binary, MODEL, "--time-to-first-token", "1500ms", "--inter-token-latency", "20ms")
    try:
        yield sim
    finally:
        sim.kill()


@pytest.fixture
def keys_file(tmp_path: Path) -> Path:
    path = tmp_path / "keys.yaml"
    path.write_text("tenants:\n  team-a:\n    keys: [sk-a]\n  team-b:\n    keys: [sk-b]\n")
    return path


def test_fifty_identical_requests_make_one_upstream_request(
    sim_binary: Path, keys_file: Path
) -> None:
    sim = Sim(sim_binary, MODEL, "--time-to-first-token", "1500ms")
    try:
        with gateway(_service(sim.url), api_keys_file=keys_file) as server:
            headers = [{"authorization": "Bearer sk-a", "x-request-id": f"r{i}"} for i in range(50)]
            url = f"{server.url}/v1/chat/completions"
            responses = asyncio.run(_post_all(url, [GREEDY] * 50, headers))
            served = _settle(sim, 1)
            coalesced = _counter(server, "llmfleet_gateway_coalesced", how="in_flight")
    finally:
        sim.kill()
    assert served == 1
    assert [r.status_code for r in responses] == [200] * 50
    assert len({r.content for r in responses}) == 1
    assert responses[0].json()["choices"][0]["message"]["content"]
    assert [r.headers["x-request-id"] for r in responses] == [f"r{i}" for i in range(50)]
    assert sum(r.headers.get(COALESCED) == "true" for r in responses) == 49
    assert coalesced == 49


def test_fifty_identical_streams_get_byte_identical_chunks(slow_sim: Sim) -> None:
    before = _served(slow_sim)
    body = {**GREEDY, "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    with gateway(_service(slow_sim.url)) as server:
        results = asyncio.run(_stream_all(f"{server.url}/v1/chat/completions", body, 50))
        served = _settle(slow_sim, before + 1) - before
        coalesced = _counter(server, "llmfleet_gateway_coalesced", how="in_flight")
    assert served == 1
    assert [r.status_code for r, _ in results] == [200] * 50
    assert [r.headers["x-request-id"] for r, _ in results] == [f"r{i}" for i in range(50)]
    streams = {data for _, data in results}
    assert len(streams) == 1
    (stream,) = streams
    events = [e for e in stream.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    assert len(events) > 10  # one per token, the usage chunk, [DONE]
    assert coalesced == 49


def test_a_late_joiner_gets_the_chunks_already_sent_then_the_live_ones(sim_binary: Path) -> None:
    sim = Sim(sim_binary, MODEL, "--inter-token-latency", "100ms")
    # ignore_eos: the simulator otherwise picks a random length up to max_tokens (as short as
    # 3 tokens), and a stream that is over before the second caller arrives has nothing to join
    body = {**GREEDY, "max_tokens": 60, "stream": True, "ignore_eos": True}
    try:
        with gateway(_service(sim.url)) as server:
            url = f"{server.url}/v1/chat/completions"
            with httpx.stream("POST", url, json=body, timeout=30) as first:
                chunks = first.iter_raw()
                head = b""
                while head.count(b"\n\n") < 3:  # three events sent before the second joins
                    head += next(chunks)
                late = httpx.post(url, json=body, timeout=30)
                whole = head + b"".join(chunks)
            served = _settle(sim, 1)
    finally:
        sim.kill()
    assert served == 1
    assert late.headers[COALESCED] == "true"
    assert late.content == whole
    assert whole.rstrip().endswith(b"data: [DONE]")


def _raw_stream_request(port: int, body: bytes) -> socket.socket:
    """A client that asks for a stream and then reads nothing: a tiny receive buffer, so the
    gateway's writes to it block as soon as the kernel's buffers are full."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
        "x-request-id: slow\r\nconnection: close\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    sock.settimeout(30)
    data = b""
    while chunk := sock.recv(1 << 16):
        data += chunk
    return data


def test_a_slow_reader_is_dropped_and_never_slows_the_others(sim_binary: Path) -> None:
    # 40000 tokens: about 8 MB of events, more than the kernel buffers a stalled reader's
    # connection (4 MB send buffer at most here), so the gateway really cannot write to it.
    sim = Sim(sim_binary, MODEL, "--max-model-len", "100000", "--time-to-first-token", "500ms")
    body = {**GREEDY, "max_tokens": 40_000, "ignore_eos": True, "stream": True}
    try:
        with gateway(_service(sim.url), coalesce_max_lag_chunks=64) as server:
            slow = _raw_stream_request(server.port, json.dumps(body).encode())
            # The slow request must start the flight: one that joined after the others' flight
            # had its chunks would owe none of them, and never fall behind.
            wait_for(
                lambda: _gauge(server, "llmfleet_gateway_in_flight_requests") >= 1 or None,
                30, "the slow request in flight",
            )  # fmt: skip
            try:
                # The others read everything while the slow one reads nothing: a broadcaster
                # that waited for it would stall them (and the test, at the 30 s timeout).
                results = asyncio.run(_stream_all(f"{server.url}/v1/chat/completions", body, 3))
                dropped_while_others_done = _counter(
                    server, "llmfleet_gateway_coalesce_dropped_readers"
                )
                slowly = _read_all(slow)
            finally:
                slow.close()
            dropped = _counter(server, "llmfleet_gateway_coalesce_dropped_readers")
            served = _settle(sim, 1)
    finally:
        sim.kill()
    assert served == 1
    assert len({data for _, data in results}) == 1
    assert results[0][1].rstrip().endswith(b"data: [DONE]")
    assert results[0][1].count(b"\n\n") > 40_000
    assert dropped_while_others_done == 0  # it is dropped when it reads again
    assert dropped == 1
    assert b'"code": "slow_reader"' in slowly
    assert b"[DONE]" not in slowly


SAMPLED = {**CHAT, "temperature": 0.8}


@pytest.mark.parametrize(
    ("coalesce", "body", "headers", "upstream"),
    [
        pytest.param(
            True,
            SAMPLED,
            [{"x-session-id": "alice"}, {"x-session-id": "bob"}],
            2,
            id="two-sessions-sampling-without-seed",
        ),
        pytest.param(
            True,
            SAMPLED,
            [{"x-session-id": "alice"}, {"x-session-id": "alice"}],
            1,
            id="double-click-of-one-session",
        ),
        pytest.param(True, SAMPLED, [{}, {}], 2, id="sampling-without-any-session"),
        pytest.param(
            True,
            {**SAMPLED, "seed": 7},
            [{"x-session-id": "alice"}, {"x-session-id": "bob"}],
            1,
            id="two-sessions-seeded",
        ),
        pytest.param(
            True,
            GREEDY,
            [{"authorization": "Bearer sk-a"}, {"authorization": "Bearer sk-b"}],
            2,
            id="two-tenants",
        ),
        pytest.param(False, GREEDY, [{}, {}], 2, id="coalescing-off"),
    ],
)
def test_who_shares_an_upstream_request(
    slow_sim: Sim,
    keys_file: Path,
    *,
    coalesce: bool,
    body: dict[str, Any],
    headers: list[dict[str, str]],
    upstream: int,
) -> None:
    keys = {"api_keys_file": keys_file} if any("authorization" in h for h in headers) else {}
    before = _served(slow_sim)
    with gateway(_service(slow_sim.url, CoalesceSpec(enabled=coalesce)), **keys) as server:
        url = f"{server.url}/v1/chat/completions"
        responses = asyncio.run(_post_all(url, [body] * len(headers), headers))
        served = _settle(slow_sim, before + upstream) - before
    assert [r.status_code for r in responses] == [200] * len(headers)
    assert served == upstream
    assert sum(COALESCED in r.headers for r in responses) == len(headers) - upstream


def test_two_users_in_the_body_sampling_without_seed_are_two_upstream_requests(
    slow_sim: Sim,
) -> None:
    before = _served(slow_sim)
    bodies = [{**SAMPLED, "user": "alice"}, {**SAMPLED, "user": "bob"}]
    with gateway(_service(slow_sim.url)) as server:
        url = f"{server.url}/v1/chat/completions"
        responses = asyncio.run(_post_all(url, bodies, [{}, {}]))
        served = _settle(slow_sim, before + 2) - before
    assert served == 2
    assert not any(COALESCED in r.headers for r in responses)


def test_one_caller_leaving_does_not_cancel_the_others_stream() -> None:
    engine = StandIn("e", chunks=30, chunk_interval=0.05)
    body = {**GREEDY, "stream": True}
    with ThreadServer(engine.app()) as e, gateway(_service(e.url)) as server:
        url = f"{server.url}/v1/chat/completions"
        with httpx.stream("POST", url, json=body, timeout=10) as stays:
            kept = stays.iter_raw()
            first = next(kept)
            with httpx.stream("POST", url, json=body, timeout=10) as leaves:
                assert leaves.headers[COALESCED] == "true"
                assert next(leaves.iter_raw())
            # the second caller left mid-stream; the first reads on to the end
            whole = first + b"".join(kept)
    assert len(engine.received) == 1
    assert not engine.client_left.is_set()
    assert whole.count(b"\n\n") == 31
    assert whole.endswith(b"data: [DONE]\n\n")


def test_one_caller_leaving_does_not_cancel_the_others_answer() -> None:
    engine = StandIn("e", delay=1.5)
    with ThreadServer(engine.app()) as e, gateway(_service(e.url)) as server:
        url = f"{server.url}/v1/chat/completions"

        async def both() -> httpx.Response:
            async with httpx.AsyncClient() as client:
                stays = asyncio.create_task(client.post(url, json=GREEDY, timeout=10))
                with pytest.raises(httpx.ReadTimeout):
                    await client.post(url, json=GREEDY, timeout=0.5)
                return await stays

        response = asyncio.run(both())
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "from e"
    assert len(engine.received) == 1
    assert not engine.client_left.is_set()


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-streaming"])
def test_the_last_caller_leaving_cancels_the_upstream_request(stream: bool) -> None:
    engine = StandIn("e", delay=0 if stream else 5.0, chunks=200, chunk_interval=0.05)
    body = {**GREEDY, "stream": stream}
    with ThreadServer(engine.app()) as e, gateway(_service(e.url)) as server:
        url = f"{server.url}/v1/chat/completions"

        async def leave_both() -> None:
            async with httpx.AsyncClient(timeout=10) as client:

                async def read_a_little() -> None:
                    if not stream:
                        with pytest.raises(httpx.ReadTimeout):
                            await client.post(url, json=body, timeout=0.5)
                        return
                    async with client.stream("POST", url, json=body) as response:
                        async for _ in response.aiter_raw():
                            break

                await asyncio.gather(read_a_little(), read_a_little())

        asyncio.run(leave_both())
        wait_for(lambda: engine.client_left.is_set() or None, 30, "the engine to see its client go")
        table = server.server.config.app.state.table  # type: ignore[union-attr]
        wait_for(lambda: table.get(e.url).in_flight == 0 or None, 30, "in-flight to drop to 0")
        coalesced = _counter(server, "llmfleet_gateway_coalesced")
    assert len(engine.received) == 1
    assert coalesced == 1


def test_an_upstream_failure_reaches_every_caller_as_its_own_error() -> None:
    engine = StandIn("e", status=500, delay=1.0)  # 500 twice (retried once): a 502 Failure
    with ThreadServer(engine.app()) as e, gateway(_service(e.url)) as server:
        url = f"{server.url}/v1/chat/completions"
        headers = [{"x-request-id": "first"}, {"x-request-id": "second"}]
        responses = asyncio.run(_post_all(url, [GREEDY, GREEDY], headers))
    assert [r.status_code for r in responses] == [502, 502]
    assert responses[0].json() == responses[1].json()
    assert [r.headers["x-request-id"] for r in responses] == ["first", "second"]
    # either may arrive first and lead; the other is coalesced
    assert sorted(str(r.headers.get(COALESCED)) for r in responses) == ["None", "true"]
    assert len(engine.received) == 1  # one endpoint: the retry found no other


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("stream", [False, True], ids=["non-streaming", "stream"])
def test_a_finished_answer_answers_identical_requests_within_the_window(
    sim_binary: Path, stream: bool
) -> None:
    sim = Sim(sim_binary, MODEL)
    clock = _Clock()
    body = {**GREEDY, "stream": stream}
    settings = GatewaySettings(scrape_interval_seconds=0.2)
    discovery = _service(sim.url, CoalesceSpec(enabled=True, window_ms=2000))
    try:
        with ThreadServer(create_app(settings, discovery=discovery, clock=clock)) as server:
            url = f"{server.url}/v1/chat/completions"
            first = httpx.post(url, json=body, timeout=10)
            assert _settle(sim, 1) == 1
            clock.now += 1.9
            again = httpx.post(url, json=body, timeout=10, headers={"x-request-id": "again"})
            other = httpx.post(url, json={**body, "max_tokens": 13}, timeout=10)
            assert _settle(sim, 2) == 2  # a different request is not answered from the window
            clock.now += 0.2  # the first answer's window is over
            late = httpx.post(url, json=body, timeout=10)
            served = _settle(sim, 3)
            window = _counter(server, "llmfleet_gateway_coalesced", how="window")
    finally:
        sim.kill()
    assert served == 3
    assert window == 1
    assert again.content == first.content
    assert again.headers[COALESCED] == "true"
    assert again.headers["x-request-id"] == "again"
    assert COALESCED not in other.headers
    assert COALESCED not in late.headers
    assert late.content != first.content  # a new answer (the simulator's ids are random)


# The stage alone, in-process (no engine needed): what the window keeps.


def _deps(clock: _Clock, **settings: Any) -> PolicyDeps:
    values = GatewaySettings(**settings)
    metrics = GatewayMetrics()
    table = EndpointTable(eject_after_failures=3, eject_seconds=10, stale_seconds=5, clock=clock)
    forwarder = Forwarder(values, httpx.AsyncClient(), table, metrics)

    async def unused(call: Call) -> Response:
        raise AssertionError("the stage is given its own next handler")

    discovery = StaticDiscovery({})
    return PolicyDeps(values, metrics, discovery, table, forwarder, unused, clock)


def _call(request_id: str, max_tokens: int) -> Call:
    spec = CoalesceSpec(enabled=True, window_ms=1000)
    service = _service("http://127.0.0.1:9", spec).services()[MODEL]
    body = {**GREEDY, "max_tokens": max_tokens}
    parsed = parse(json.dumps(body).encode(), chat=True)
    path = "/v1/chat/completions"
    return Call(request_id, service, parsed, RoutingRequest(MODEL), path, 0.0)


def test_the_window_keeps_a_bounded_number_of_good_unexpired_answers() -> None:
    clock = _Clock()
    coalescer = Coalescer(_deps(clock, coalesce_window_entries=3))
    served: list[str] = []

    async def engine(call: Call) -> Response:
        served.append(call.request_id)
        status = 400 if call.parsed.max_tokens == 99 else 200
        return Response(f"answer to {call.request_id}".encode(), status)

    async def scenario() -> None:
        for i in range(5):
            await coalescer(_call(f"a{i}", i + 1), engine)
        again = await coalescer(_call("again", 5), engine)  # a4's answer, from the window
        assert again.body == b"answer to a4"
        await coalescer(_call("old", 1), engine)  # a0 was dropped for the newer three
        await coalescer(_call("bad", 99), engine)
        await coalescer(_call("bad-again", 99), engine)  # a 4xx is never kept
        clock.now += 1.0  # every answer's window is over
        await coalescer(_call("new", 7), engine)
        assert len(coalescer._kept) == 1  # the expired ones went as the new one came

    asyncio.run(scenario())
    assert served == ["a0", "a1", "a2", "a3", "a4", "old", "bad", "bad-again", "new"]
