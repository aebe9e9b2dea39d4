"""`llmfleet load`'s sender: open-loop scheduling, the concurrency cap's drops, and how each
kind of answer (streamed tokens, HTTP errors, broken streams, no connection) is counted."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from llmfleet.autoscaler.sim.load.plan import PlannedRequest, PromptBuilder
from llmfleet.autoscaler.sim.load.replay import OpenAISender, Tally, http_error_kind, replay
from llmfleet.autoscaler.sim.load.stats import DROPPED, Outcome


def _planned(*send_at: float) -> list[PlannedRequest]:
    return [PlannedRequest(i, at, 16, 4) for i, at in enumerate(send_at)]


def test_sends_go_out_on_time_while_earlier_ones_are_still_in_flight() -> None:
    async def slow(request: PlannedRequest, sent_s: float) -> Outcome:
        await asyncio.sleep(0.5)
        return Outcome(request.index, request.send_at, sent_s, ttft_s=0.5)

    outcomes, wall_s = asyncio.run(replay(_planned(0.0, 0.1, 0.2), slow, concurrency=None))
    for outcome in outcomes:
        assert outcome.sent_s is not None
        assert outcome.scheduled_s <= outcome.sent_s < outcome.scheduled_s + 0.1
    assert wall_s >= 0.7  # the last one left at 0.2 s and took 0.5 s


def test_the_cap_drops_requests_due_while_it_is_full() -> None:
    release = asyncio.Event()

    async def held(request: PlannedRequest, sent_s: float) -> Outcome:
        await release.wait()
        return Outcome(request.index, request.send_at, sent_s, ttft_s=0.01)

    async def run() -> list[Outcome]:
        tally = Tally(6)

        async def release_after_the_drops() -> None:
            while tally.dropped < 3:
                await asyncio.sleep(0.005)
            release.set()

        releaser = asyncio.create_task(release_after_the_drops())
        # Five due at once against a cap of 2; the sixth is due after the first two finished.
        outcomes, _ = await replay(_planned(0, 0, 0, 0, 0, 0.3), held, concurrency=2, tally=tally)
        await releaser
        assert (tally.sent, tally.ok, tally.dropped, tally.in_flight) == (3, 3, 3, 0)
        return outcomes

    outcomes = asyncio.run(run())
    assert [o.error for o in outcomes] == [None, None, DROPPED, DROPPED, DROPPED, None]
    assert [o.sent_s is None for o in outcomes] == [False, False, True, True, True, False]


def test_a_send_that_raises_is_one_failed_request() -> None:
    async def broken(request: PlannedRequest, sent_s: float) -> Outcome:
        if request.index == 1:
            raise RuntimeError("bug")
        return Outcome(request.index, request.send_at, sent_s, ttft_s=0.01)

    outcomes, _ = asyncio.run(replay(_planned(0, 0, 0), broken, concurrency=None))
    assert [o.error for o in outcomes] == [None, "client error: RuntimeError", None]


def sse(*events: dict[str, Any] | str, done: bool = True) -> bytes:
    lines = [f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n" for e in events]
    return ("".join(lines) + ("data: [DONE]\n\n" if done else "")).encode()


def text(value: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "text": value}]}


USAGE = {"choices": [], "usage": {"prompt_tokens": 16, "completion_tokens": 3}}
OPENAI_429 = {"error": {"message": "slow down", "type": "rate_limit_error"}}
MID_STREAM = {"error": {"message": "engine died", "type": "upstream_error"}}


def _answer(status: int, body: bytes) -> Callable[[httpx.Request], httpx.Response]:
    return lambda _: httpx.Response(status, content=body)


def _raise(error: type[httpx.TransportError]) -> Callable[[httpx.Request], httpx.Response]:
    def handler(request: httpx.Request) -> httpx.Response:
        raise error("no", request=request)

    return handler


@pytest.mark.parametrize(
    ("handler", "error"),
    [
        pytest.param(_answer(200, sse(text("a "), text("b "), USAGE)), None, id="ok"),
        pytest.param(
            _answer(429, json.dumps(OPENAI_429).encode()),
            "http 429 rate_limit_error",
            id="openai-error",
        ),
        pytest.param(_answer(502, b"<html>bad gateway</html>"), "http 502", id="plain-http-error"),
        pytest.param(
            _answer(200, sse(text("a "), MID_STREAM, done=False)),
            "stream error: upstream_error",
            id="error-event-mid-stream",
        ),
        pytest.param(_answer(200, sse(text("a "), done=False)), "stream cut", id="no-done"),
        pytest.param(_answer(200, sse(text("a "), "{not json")), "bad stream", id="bad-json"),
        pytest.param(_answer(200, sse(USAGE)), "empty answer", id="no-text"),
        pytest.param(_raise(httpx.ConnectError), "connection", id="refused"),
        pytest.param(_raise(httpx.RemoteProtocolError), "connection", id="broken"),
        pytest.param(_raise(httpx.ReadTimeout), "timeout", id="timeout"),
    ],
)
def test_answers_and_errors_by_kind(
    handler: Callable[[httpx.Request], httpx.Response], error: str | None
) -> None:
    seen: list[httpx.Request] = []

    def recording(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return handler(request)

    ticks = itertools.count()

    async def run() -> Outcome:
        transport = httpx.MockTransport(recording)
        async with httpx.AsyncClient(base_url="http://gw", transport=transport) as client:
            sender = OpenAISender(client, "m", PromptBuilder(1), clock=lambda: next(ticks) / 100)
            return await sender(PlannedRequest(3, 1.0, 16, 4), 1.25)

    outcome = asyncio.run(run())
    assert (outcome.index, outcome.scheduled_s, outcome.sent_s) == (3, 1.0, 1.25)
    assert outcome.error == error
    assert outcome.prompt_tokens == 16
    body = json.loads(seen[0].content)
    assert seen[0].url.path == "/v1/completions"
    assert body["model"] == "m"
    assert body["max_tokens"] == 4
    assert body["ignore_eos"] is True
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert len(body["prompt"]) == 16 * 4
    if error is None:
        # The clock ticks 10 ms a call: sent at 0, first text at 10 ms, the next at 20 ms.
        assert outcome.ttft_s == pytest.approx(0.01)
        assert outcome.gaps_s == pytest.approx((0.01,))
        assert (outcome.output_tokens, outcome.prompt_tokens_counted) == (3, 16)


@pytest.mark.parametrize(
    ("status", "body", "kind"),
    [
        pytest.param(404, b'{"error": {"type": "not_found_error"}}', "http 404 not_found_error"),
        pytest.param(500, b'{"detail": "x"}', "http 500", id="not-openai-shaped"),
        pytest.param(500, b'["x"]', "http 500", id="not-an-object"),
        pytest.param(503, b"", "http 503", id="empty"),
    ],
)
def test_http_error_kind(status: int, body: bytes, kind: str) -> None:
    assert http_error_kind(status, body) == kind
