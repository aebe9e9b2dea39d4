"""Debouncing (`traffic.debounce: {mode: LatestWins}`): a newer request of the same session
supersedes the older one; the superseded caller gets 409 `superseded` (or, mid-stream, a final
SSE error event).

Through the real gateway: llm-d-inference-sim (echo mode) counts the requests that reach an
engine; where an engine must notice that its client left (the simulator does not: it finishes
abandoned requests), the stand-in engine of `standin.py` does, and the test says so. The last
test drives the stage on its own with a fake engine, for the races and the table's cleanup.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from starlette.responses import Response

from llmfleet.crds.policy import DebounceMode, DebounceSpec, TrafficSpec
from llmfleet.gateway.discovery import Pool, Service, StaticDiscovery
from llmfleet.gateway.endpoints import EndpointTable
from llmfleet.gateway.metrics import GatewayMetrics
from llmfleet.gateway.openai_request import parse
from llmfleet.gateway.policies.base import PolicyDeps
from llmfleet.gateway.policies.debounce import Debouncer
from llmfleet.gateway.proxy import Call, Failure
from llmfleet.gateway.routing.base import RoutingRequest
from llmfleet.gateway.settings import GatewaySettings
from tests.gateway.servers import Sim, ThreadServer, gateway, wait_for
from tests.gateway.standin import StandIn

MODEL = "m"
CHAT = "/v1/chat/completions"


def _discovery(url: str, mode: DebounceMode, window_ms: int, delay_ms: int) -> StaticDiscovery:
    debounce = DebounceSpec(mode=mode, window_ms=window_ms, delay_ms=delay_ms)
    service = Service(
        MODEL, "ns", "svc", {"unified": Pool("unified", (url,))}, TrafficSpec(debounce=debounce)
    )
    return StaticDiscovery({MODEL: service})


def _body(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], **extra}


def _headers(request_id: str, session: str | None = "s1", **more: str) -> dict[str, str]:
    headers = {"x-request-id": request_id, **more}
    if session is not None:
        headers["x-session-id"] = session
    return headers


def _metric(url: str, name: str, **labels: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    total = 0.0
    for found, value in re.findall(rf"^{re.escape(name)}\{{([^}}]*)\}} (\S+)$", text, re.M):
        if all(f'{key}="{want}"' in found for key, want in labels.items()):
            total += float(value)
    return total


def _engine_requests(sim: Sim) -> int:
    """Requests the simulator has finished (it finishes every request it received), read once
    it has nothing running or waiting."""

    def idle() -> bool | None:
        busy = _metric(sim.url, "vllm:num_requests_running")
        busy += _metric(sim.url, "vllm:num_requests_waiting")
        return True if busy == 0 else None

    wait_for(idle, 30, "the simulator to finish its requests")
    return int(_metric(sim.url, "vllm:e2e_request_latency_seconds_count"))


@pytest.fixture(scope="module")
def sim(sim_binary: Path) -> Iterator[Sim]:
    engine = Sim(sim_binary, MODEL, "--mode", "echo")
    try:
        yield engine
    finally:
        engine.kill()


async def _send_apart(
    url: str, requests: list[tuple[dict[str, Any], dict[str, str]]], gap: float
) -> list[httpx.Response]:
    """Send `requests` `gap` seconds apart, each on its own connection; their responses."""
    async with httpx.AsyncClient(base_url=url, timeout=20) as client:
        tasks = []
        for body, headers in requests:
            tasks.append(asyncio.create_task(client.post(CHAT, json=body, headers=headers)))
            await asyncio.sleep(gap)
        return list(await asyncio.gather(*tasks))


def _answer(response: httpx.Response) -> str:
    """The answer's text, from a JSON body or the content deltas of a stream."""
    if not response.headers["content-type"].startswith("text/event-stream"):
        return str(response.json()["choices"][0]["message"]["content"])
    events = [line[6:] for line in response.text.splitlines() if line.startswith("data: {")]
    deltas = [json.loads(event)["choices"] for event in events]
    return "".join(c[0]["delta"].get("content") or "" for c in deltas if c)


def _assert_superseded(response: httpx.Response, by: str) -> None:
    assert response.status_code == 409, response.text
    error = response.json()["error"]
    assert error["code"] == "superseded"
    assert error["type"] == "conflict_error"
    assert f"request id {by}" in error["message"]
    assert "newer request of the same session" in error["message"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_three_requests_within_the_window_only_the_last_reaches_the_engine(
    sim: Sim, stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="llmfleet.gateway.policies")
    discovery = _discovery(sim.url, DebounceMode.LATEST_WINS, window_ms=3000, delay_ms=1000)
    before = _engine_requests(sim)
    with gateway(discovery) as server:
        requests = [(_body(f"click {n}", stream=stream), _headers(n)) for n in ("a", "b", "c")]
        first, second, last = asyncio.run(_send_apart(server.url, requests, gap=0.05))
        held = _metric(server.url, "llmfleet_gateway_superseded_total", when="held")
    _assert_superseded(first, by="b")
    _assert_superseded(second, by="c")
    assert last.status_code == 200
    assert _answer(last) == "click c"  # echo: the last request's own answer
    assert _engine_requests(sim) - before == 1
    assert held == 2
    lines = [r.getMessage() for r in caplog.records if "superseded_by" in r.getMessage()]
    assert sorted(lines) == [
        "request_id=a superseded_by=b service=ns/svc when=held",
        "request_id=b superseded_by=c service=ns/svc when=held",
    ]


KEYS = "tenants:\n  team-a: {keys: [key-a]}\n  team-b: {keys: [key-b]}\n"


@pytest.mark.parametrize(
    ("mode", "headers"),
    [
        pytest.param(
            DebounceMode.LATEST_WINS,
            [_headers("a", "s1"), _headers("b", "s2"), _headers("c", "s3")],
            id="different-sessions",
        ),
        pytest.param(
            DebounceMode.LATEST_WINS,
            [_headers("a", None), _headers("b", None), _headers("c", None)],
            id="no-session",
        ),
        pytest.param(
            DebounceMode.LATEST_WINS,
            [
                _headers("a", "s1", authorization="Bearer key-a"),
                _headers("b", "s1", authorization="Bearer key-b"),
            ],
            id="same-session-id-other-tenant",
        ),
        pytest.param(
            DebounceMode.OFF,
            [_headers("a"), _headers("b"), _headers("c")],
            id="off",
        ),
    ],
)
def test_requests_that_do_not_supersede_each_other_all_reach_the_engine(
    sim: Sim, tmp_path: Path, mode: DebounceMode, headers: list[dict[str, str]]
) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(KEYS)
    with_keys = any("authorization" in h for h in headers)
    settings: dict[str, Any] = {"api_keys_file": keys} if with_keys else {}
    before = _engine_requests(sim)
    discovery = _discovery(sim.url, mode, window_ms=3000, delay_ms=300)
    with gateway(discovery, **settings) as server:
        requests = [(_body(f"click {h['x-request-id']}"), h) for h in headers]
        responses = asyncio.run(_send_apart(server.url, requests, gap=0.05))
        superseded = _metric(server.url, "llmfleet_gateway_superseded_total")
    assert [r.status_code for r in responses] == [200] * len(headers)
    assert _engine_requests(sim) - before == len(headers)
    assert superseded == 0


def test_requests_farther_apart_than_the_window_do_not_supersede(sim_binary: Path) -> None:
    # A slow first token keeps the first request in flight while the second arrives.
    slow = Sim(sim_binary, MODEL, "--mode", "echo", "--time-to-first-token", "1500ms")
    try:
        discovery = _discovery(slow.url, DebounceMode.LATEST_WINS, window_ms=200, delay_ms=5)
        with gateway(discovery) as server:

            async def run() -> tuple[httpx.Response, float, httpx.Response]:
                async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
                    first = asyncio.create_task(
                        client.post(CHAT, json=_body("one"), headers=_headers("a"))
                    )
                    await asyncio.sleep(0.6)  # three windows later
                    sent = time.monotonic()
                    second = await client.post(CHAT, json=_body("two"), headers=_headers("b"))
                    return await first, sent, second

            first, second_sent, second = asyncio.run(run())
            first_done = time.monotonic()
        assert [first.status_code, second.status_code] == [200, 200]
        assert "one" in first.text
        assert "two" in second.text
        assert first_done > second_sent  # the first was still in flight: it was not superseded
        assert _engine_requests(slow) == 2
    finally:
        slow.kill()


def test_a_dispatched_request_is_cancelled_at_the_engine() -> None:
    # Stand-in: it notices its client leaving (the simulator finishes abandoned requests).
    engine = StandIn("slow", delay=3.0)
    with ThreadServer(engine.app()) as e:
        discovery = _discovery(e.url, DebounceMode.LATEST_WINS, window_ms=10_000, delay_ms=0)
        with gateway(discovery) as server:

            async def run() -> tuple[httpx.Response, float, httpx.Response]:
                async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
                    first = asyncio.create_task(
                        client.post(CHAT, json=_body("one"), headers=_headers("a"))
                    )
                    while not engine.received:  # dispatched: the engine has it
                        await asyncio.sleep(0.02)
                    second = asyncio.create_task(
                        client.post(CHAT, json=_body("two"), headers=_headers("b"))
                    )
                    superseded = await first
                    left = await asyncio.to_thread(engine.client_left.wait, 2.5)
                    return superseded, left, await second

            first, left, second = asyncio.run(run())
            dispatched = _metric(server.url, "llmfleet_gateway_superseded_total", when="dispatched")
            table = server.server.config.app.state.table  # type: ignore[attr-defined]
            wait_for(lambda: table.get(e.url).in_flight == 0 or None, 30, "in-flight to drop to 0")
    _assert_superseded(first, by="b")
    assert left, "the engine did not see the superseded request's connection close"
    assert second.status_code == 200
    assert [body["messages"][0]["content"] for body in engine.received] == ["one", "two"]
    assert dispatched == 1


@pytest.mark.parametrize("client", ["httpx", "openai"])
def test_a_superseded_stream_ends_with_an_sse_error_event(client: str) -> None:
    # Stand-in: a slow stream that notices its client leaving.
    engine = StandIn("slow", chunks=100, chunk_interval=0.05)
    with ThreadServer(engine.app()) as e:
        discovery = _discovery(e.url, DebounceMode.LATEST_WINS, window_ms=10_000, delay_ms=0)
        with gateway(discovery) as server:
            newer = _headers("b")
            if client == "httpx":
                with httpx.stream(
                    "POST",
                    f"{server.url}{CHAT}",
                    json=_body("one", stream=True),
                    headers=_headers("a"),
                    timeout=10,
                ) as response:
                    lines = response.iter_lines()
                    assert next(lines).startswith("data: {")  # under way
                    second = httpx.post(f"{server.url}{CHAT}", json=_body("two"), headers=newer)
                    events = [line for line in lines if line.startswith("data: ")]
                assert response.status_code == 200
                assert "[DONE]" not in "".join(events)
                error = json.loads(events[-1][len("data: ") :])["error"]
                assert error["code"] == "superseded"
                assert "request id b" in error["message"]
            else:
                sdk = openai.OpenAI(base_url=f"{server.url}/v1", api_key="-", max_retries=0)
                stream = sdk.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": "one"}],
                    stream=True,
                    extra_headers=_headers("a"),
                )
                assert next(stream).choices[0].delta.content  # under way
                second = httpx.post(f"{server.url}{CHAT}", json=_body("two"), headers=newer)
                with pytest.raises(openai.APIError, match="superseded by a newer request"):
                    list(stream)
                sdk.close()  # its socket is not left to a garbage collection in a later test
            assert second.status_code == 200
            wait_for(lambda: engine.client_left.is_set() or None, 30, "the engine to see it go")
            dispatched = _metric(server.url, "llmfleet_gateway_superseded_total", when="dispatched")
            table = server.server.config.app.state.table  # type: ignore[attr-defined]
            wait_for(lambda: table.get(e.url).in_flight == 0 or None, 30, "in-flight to drop to 0")
    assert dispatched == 1


def test_the_openai_client_raises_a_conflict_error(sim: Sim) -> None:
    discovery = _discovery(sim.url, DebounceMode.LATEST_WINS, window_ms=3000, delay_ms=1000)
    with gateway(discovery) as server:

        async def run() -> list[Any]:
            sdk = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="-", max_retries=0)
            async with sdk:
                calls = []
                for text in ("one", "two"):
                    create = sdk.chat.completions.create(
                        model=MODEL,
                        messages=[{"role": "user", "content": text}],
                        extra_headers={"x-session-id": "s1"},
                    )
                    calls.append(asyncio.ensure_future(create))
                    await asyncio.sleep(0.05)
                return await asyncio.gather(*calls, return_exceptions=True)

        older, newer = asyncio.run(run())
    assert isinstance(older, openai.ConflictError)
    assert older.code == "superseded"
    assert newer.choices[0].message.content == "two"


# The stage on its own: arrivals `gap` apart into a fake engine that answers after `engine`
# seconds; which requests reach it, which are superseded and how, and the table emptied.
def _spec(delay_ms: int, window_ms: int) -> DebounceSpec:
    return DebounceSpec(mode=DebounceMode.LATEST_WINS, window_ms=window_ms, delay_ms=delay_ms)


@pytest.mark.parametrize(
    ("gaps", "spec", "engine", "reached", "outcomes"),
    [
        pytest.param(
            [0, 0, 0], _spec(50, 1000), 0.0, ["c"], ["held", "held", "ok"], id="three-at-once"
        ),
        pytest.param(
            [0, 0.02, 0.02], _spec(200, 1000), 0.0, ["c"], ["held", "held", "ok"], id="three-held"
        ),
        pytest.param(
            [0, 0.1, 0.1], _spec(0, 1000), 1.0, ["a", "b", "c"],
            ["dispatched", "dispatched", "ok"], id="three-dispatched",
        ),
        pytest.param(
            [0, 0.1, 0.01], _spec(50, 1000), 1.0, ["a", "c"], ["dispatched", "held", "ok"],
            id="dispatched-then-held",
        ),
        pytest.param(
            [0, 0.3], _spec(0, 100), 0.5, ["a", "b"], ["ok", "ok"], id="beyond-the-window"
        ),
    ],
)  # fmt: skip
def test_the_stage_lets_the_newest_win(
    gaps: list[float], spec: DebounceSpec, engine: float, reached: list[str], outcomes: list[str]
) -> None:
    service = Service(MODEL, "ns", "svc", {}, TrafficSpec(debounce=spec))
    metrics = GatewayMetrics()
    stage = Debouncer(
        PolicyDeps(
            GatewaySettings(),
            metrics,
            StaticDiscovery({MODEL: service}),
            EndpointTable(eject_after_failures=3, eject_seconds=1, stale_seconds=1),
            forwarder=None,  # type: ignore[arg-type]  # not used by this stage
            serve=None,  # type: ignore[arg-type]
        )
    )
    seen: list[str] = []

    async def fake_engine(call: Call) -> Response:
        seen.append(call.request_id)
        await asyncio.sleep(engine)
        return Response(b"{}")

    async def one(request_id: str) -> str:
        parsed = parse(b'{"model": "%s", "messages": [{}]}' % MODEL.encode(), chat=True)
        call = Call(request_id, service, parsed, RoutingRequest(MODEL), CHAT, 0.0)
        call.session = "s1"
        try:
            await stage(call, fake_engine)
        except Failure as failure:
            return str(failure.response.status_code)
        return "ok"

    async def run() -> list[str]:
        tasks = []
        for n, gap in enumerate(gaps):
            await asyncio.sleep(gap)
            tasks.append(asyncio.create_task(one("abcde"[n])))
        return list(await asyncio.gather(*tasks))

    results = asyncio.run(run())
    labels = {"namespace": "ns", "service": "svc", "model": MODEL}
    superseded = {
        when: metrics.registry.get_sample_value(
            "llmfleet_gateway_superseded_total", {**labels, "when": when}
        )
        or 0
        for when in ("held", "dispatched")
    }
    assert seen == reached
    assert results == ["ok" if o == "ok" else "409" for o in outcomes]
    assert superseded == {w: outcomes.count(w) for w in ("held", "dispatched")}
    assert stage._latest == {}
