"""Hardening, in-process: every crafted input of issue 14 is a 4xx in OpenAI's error shape, counted
in the metrics, never a 500, and the gateway serves the next request as if nothing had happened.

The app runs over `httpx.ASGITransport`; its engines are an `httpx.MockTransport` that answers
200 and records what reached it, so a 5xx can only be the gateway's own and a refused request
must never reach an engine. The same contract over real sockets (body limit, header size, slow
clients) is in `test_hardening_sockets.py`.

Contract of every answer (`assert_openai_error`): an `x-request-id` header; a 4xx/5xx body of
exactly `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from llmfleet.gateway.app import create_app
from llmfleet.gateway.discovery import Pool, Service, StaticDiscovery
from llmfleet.gateway.settings import GatewaySettings

MODEL = "m"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
ENDPOINTS = ("http://127.0.0.1:8001", "http://127.0.0.1:8002")
ENGINE_ANSWER = {"id": "x", "object": "chat.completion", "choices": [], "usage": None}
NORMAL = {CHAT: {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
          COMPLETIONS: {"model": MODEL, "prompt": "hi"}}  # fmt: skip
DEPTH = 100_000
DEFAULT_BODY_LIMIT = 8 * 1024 * 1024
INT64_MAX = 2**63 - 1
HUGE = int("9" * 400)
"""A `max_tokens` of 400 digits (beyond 308 digits an int no longer converts to a float)."""


@dataclass
class Engine:
    """The engines' stand-in: answers every completion with 200 after `latency` seconds (the
    time requests overlap in flight) and keeps the bodies and request ids that reached it."""

    latency: float = 0.0
    bodies: list[bytes] = field(default_factory=list)
    request_ids: list[bytes | None] = field(default_factory=list)

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            self.bodies.append(request.content)
            self.request_ids.append(_raw_header(request.headers, b"x-request-id"))
            await asyncio.sleep(self.latency)
        return httpx.Response(200, json=ENGINE_ANSWER)


def _raw_header(headers: httpx.Headers, name: bytes) -> bytes | None:
    return next((value for key, value in headers.raw if key.lower() == name), None)


class Gateway:
    """A gateway app (no lifespan, as in the other in-process tests) with its engine stand-in;
    `post` and `metrics` each run one request on an event loop of its own."""

    def __init__(self, engine: Engine | None = None, **settings: Any) -> None:
        self.engine = engine or Engine()
        service = Service(MODEL, "ns", "svc", {"unified": Pool("unified", ENDPOINTS)})
        self.discovery = BreakableDiscovery({MODEL: service})
        self.app = create_app(
            GatewaySettings(**settings),
            discovery=self.discovery,
            transport=httpx.MockTransport(self.engine),
        )

    def client(self) -> httpx.AsyncClient:
        # raise_app_exceptions=False: an exception that escapes the app is the 500 a server
        # would send, which is what the assertions below must see (and name).
        transport = httpx.ASGITransport(self.app, raise_app_exceptions=False)
        return httpx.AsyncClient(transport=transport, base_url="http://gw", timeout=30)

    def post(
        self, path: str, content: bytes, headers: Mapping[str, str | bytes] | None = None
    ) -> httpx.Response:
        async def run() -> httpx.Response:
            async with self.client() as client:
                return await client.post(path, content=content, headers=_headers(headers))

        return asyncio.run(run())

    def metrics(self) -> str:
        async def run() -> str:
            async with self.client() as client:
                return (await client.get("/metrics")).text

        return asyncio.run(run())

    def serves_a_normal_request(self, path: str = CHAT) -> None:
        response = self.post(path, json.dumps(NORMAL[path]).encode())
        assert response.status_code == 200, response.text
        assert _raw_header(response.headers, b"x-request-id")


class BreakableDiscovery(StaticDiscovery):
    """Static services until `broken` is set; then reading them raises, an error the gateway
    cannot foresee (the unexpected-exception contract)."""

    broken = False

    def services(self) -> Mapping[str, Service]:
        if self.broken:
            raise RuntimeError("discovery broke (injected by the test)")
        return super().services()


def _headers(extra: Mapping[str, str | bytes] | None) -> list[tuple[bytes, bytes]]:
    headers = [(b"content-type", b"application/json")]
    for name, value in (extra or {}).items():
        headers.append((name.encode(), value if isinstance(value, bytes) else value.encode()))
    return headers


def assert_openai_error(response: httpx.Response, status: int, param: str | None = None) -> None:
    """`response` is `status` in OpenAI's error shape, with an `x-request-id`; `param`, when
    given, is the field the error names."""
    assert response.status_code == status, f"{response.status_code}: {response.text[:500]}"
    assert _raw_header(response.headers, b"x-request-id"), "no x-request-id on the answer"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str)
    assert error["message"]
    if 400 <= status < 500 and status not in (401, 404, 409, 429):
        assert error["type"] == "invalid_request_error", error
    if param is not None:
        assert error["param"] == param, error


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` (all label sets, or those with `labels`) in an exposition."""
    total = 0.0
    for match in re.finditer(rf"^{name}(?:\{{([^}}]*)\}})? (\S+)$", text, re.MULTILINE):
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1) or ""))
        if all(found.get(key) == value for key, value in labels.items()):
            total += float(match.group(2))
    return total


def _chat_with(**fields: Any) -> bytes:
    return json.dumps({**NORMAL[CHAT], **fields}).encode()


def _deep(opener: str, closer: str, leaf: str = "") -> str:
    return opener * DEPTH + leaf + closer * DEPTH


@dataclass(frozen=True)
class Crafted:
    path: str
    body: bytes
    status: int = 400
    param: str | None = None
    fragment: str | None = None
    """A pattern the message must match (case-insensitive), when the cause must be named."""


CRAFTED = {
    "deep-array-in-content": Crafted(
        CHAT,
        ('{"model":"m","messages":[{"role":"user","content":' + _deep("[", "]") + "}]}").encode(),
    ),
    "deep-object-in-an-extra-field": Crafted(
        CHAT,
        (
            '{"model":"m","messages":[{"role":"user","content":"hi"}],"extra":'
            + _deep('{"a":', "}", "1")
            + "}"
        ).encode(),
    ),
    "deep-array-as-prompt": Crafted(
        COMPLETIONS, ('{"model":"m","prompt":' + _deep("[", "]") + "}").encode()
    ),
    "lone-surrogate-in-content": Crafted(
        CHAT,
        b'{"model":"m","messages":[{"role":"user","content":"\\ud800"}]}',
        fragment="unicode|surrogate",
    ),
    "lone-surrogate-in-prompt": Crafted(
        COMPLETIONS, b'{"model":"m","prompt":"a\\udfffb"}', fragment="unicode|surrogate"
    ),
    "stream-yes": Crafted(CHAT, _chat_with(stream="yes"), param="stream"),
    "max-tokens-true": Crafted(CHAT, _chat_with(max_tokens=True), param="max_tokens"),
    "max-tokens-0": Crafted(CHAT, _chat_with(max_tokens=0), param="max_tokens"),
    "max-tokens-minus-1": Crafted(CHAT, _chat_with(max_tokens=-1), param="max_tokens"),
    "max-tokens-1.5": Crafted(CHAT, _chat_with(max_tokens=1.5), param="max_tokens"),
    "n-0": Crafted(CHAT, _chat_with(n=0), param="n"),
    "n-string": Crafted(CHAT, _chat_with(n="2"), param="n"),
    "temperature-minus-1": Crafted(CHAT, _chat_with(temperature=-1), param="temperature"),
    "temperature-string": Crafted(CHAT, _chat_with(temperature="hot"), param="temperature"),
    "messages-empty": Crafted(CHAT, _chat_with(messages=[]), param="messages"),
    "prompt-object": Crafted(COMPLETIONS, b'{"model":"m","prompt":{}}', param="prompt"),
    "body-an-array": Crafted(CHAT, b"[1]"),
    "body-a-string": Crafted(CHAT, b'"x"'),
    "body-not-json": Crafted(CHAT, b"model=m&messages=hi"),
    "body-invalid-utf8": Crafted(CHAT, b"\xff"),
    "invalid-utf8-in-a-string": Crafted(
        CHAT, b'{"model":"m","messages":[{"role":"user","content":"\xff\xfe"}]}'
    ),
    "body-empty": Crafted(CHAT, b""),
}


@pytest.mark.parametrize("crafted", list(CRAFTED.values()), ids=list(CRAFTED))
def test_a_crafted_input_is_a_4xx_in_openai_shape_and_the_gateway_serves_on(
    crafted: Crafted,
) -> None:
    gateway = Gateway()
    response = gateway.post(crafted.path, crafted.body)
    assert_openai_error(response, crafted.status, crafted.param)
    if crafted.fragment is not None:
        assert re.search(crafted.fragment, response.json()["error"]["message"], re.IGNORECASE)
    assert gateway.engine.bodies == [], "a refused request reached an engine"
    gateway.serves_a_normal_request(crafted.path)


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"stream": None}, id="stream-null"),
        pytest.param({"stream": False}, id="stream-false"),
        pytest.param({"max_tokens": None, "n": None, "temperature": None}, id="nulls"),
        pytest.param({"max_tokens": 1, "n": 1, "temperature": 0}, id="lowest-values"),
        pytest.param({"temperature": 0.7, "max_completion_tokens": 16}, id="float-temperature"),
        pytest.param(
            {"messages": [{"role": "user", "content": "é \u2603 \U0001f600"}]},
            id="non-ascii-content",
        ),
    ],
)
def test_strict_types_still_accept_what_the_engine_accepts(fields: dict[str, Any]) -> None:
    gateway = Gateway()
    response = gateway.post(CHAT, _chat_with(**fields))
    assert response.status_code == 200, response.text
    assert len(gateway.engine.bodies) == 1


@pytest.mark.parametrize(
    "request_id",
    [
        pytest.param("é".encode("latin-1"), id="latin-1-byte"),
        pytest.param("é".encode(), id="utf-8-e-acute"),
        pytest.param("请求-1".encode(), id="utf-8-cjk"),
        pytest.param(b"id\x7f\x80\xff", id="del-and-high-bytes"),
    ],
)
def test_a_non_ascii_request_id_is_sanitised_or_refused(request_id: bytes) -> None:
    gateway = Gateway()
    response = gateway.post(CHAT, _chat_with(), {"x-request-id": request_id})
    assert response.status_code < 500, response.text
    echoed = _raw_header(response.headers, b"x-request-id")
    assert echoed, "no x-request-id on the answer"
    assert echoed.isascii(), echoed
    if response.status_code >= 400:
        assert_openai_error(response, response.status_code)
    for sent in gateway.engine.request_ids:
        assert sent is not None
        assert sent.isascii(), sent
    gateway.serves_a_normal_request()


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        pytest.param(CHAT, _chat_with(), 200, id="served"),
        pytest.param(CHAT, b"{", 400, id="bad-request"),
        pytest.param(CHAT, _chat_with(model="nope"), 404, id="unknown-model"),
        pytest.param(CHAT, b"x" * (DEFAULT_BODY_LIMIT + 1), 413, id="body-too-large"),
    ],
)
def test_a_client_request_id_is_echoed_on_every_answer(path: str, body: bytes, status: int) -> None:
    response = Gateway().post(path, body, {"x-request-id": "req-42"})
    assert response.status_code == status, response.text[:500]
    assert response.headers["x-request-id"] == "req-42"


@pytest.mark.parametrize("digits", [300, 400])
def test_a_huge_max_tokens_under_concurrency_is_never_a_5xx(digits: int) -> None:
    """A `max_tokens` of that many digits in 200 concurrent requests over two endpoints: the
    in-flight token figures the scorers compare must stay finite (past 308 digits they were an
    OverflowError per request)."""
    gateway = Gateway(Engine(latency=0.05))
    body = _chat_with(max_tokens=int("9" * digits))

    async def run() -> list[httpx.Response | BaseException]:
        async with gateway.client() as client:
            return await asyncio.gather(
                *(client.post(CHAT, content=body, headers=_headers(None)) for _ in range(200)),
                return_exceptions=True,
            )

    answers = asyncio.run(run())
    problems = [
        repr(a) if isinstance(a, BaseException) else f"{a.status_code}: {a.text[:200]}"
        for a in answers
        if isinstance(a, BaseException) or a.status_code >= 500
    ]
    assert not problems, f"{len(problems)} of 200 failed, first: {problems[0]}"
    for answer in answers:
        assert isinstance(answer, httpx.Response)
        if answer.status_code != 200:
            assert_openai_error(answer, 400, "max_tokens")
    assert metric_sum(gateway.metrics(), "llmfleet_gateway_internal_errors_total") == 0
    gateway.serves_a_normal_request()


@pytest.mark.parametrize("field_name", ["max_tokens", "max_completion_tokens"])
def test_a_max_tokens_beyond_any_context_is_capped_or_refused(field_name: str) -> None:
    """Served, the engine gets a limit in its range (a signed 64-bit integer), not `HUGE`."""
    gateway = Gateway()
    response = gateway.post(CHAT, _chat_with(**{field_name: HUGE}))
    if response.status_code != 200:
        assert_openai_error(response, 400, field_name)
        return
    (sent,) = gateway.engine.bodies
    for name in ("max_tokens", "max_completion_tokens"):
        # the body may repeat a key (a splice); a JSON reader takes the last value
        value = json.loads(sent).get(name)
        assert value is None or value <= INT64_MAX, f"{name} reached the engine uncapped"


def _sized_chat(size: int) -> bytes:
    """A valid chat body of exactly `size` bytes."""
    empty = _chat_with(messages=[{"role": "user", "content": ""}])
    content = "a" * (size - len(empty))
    body = _chat_with(messages=[{"role": "user", "content": content}])
    assert len(body) == size
    return body


def test_a_10_mb_body_is_a_413_at_the_default_limit() -> None:
    gateway = Gateway()
    response = gateway.post(CHAT, _sized_chat(10_000_000))
    assert_openai_error(response, 413)
    assert response.json()["error"]["code"] == "body_too_large"
    assert gateway.engine.bodies == []
    gateway.serves_a_normal_request()


def test_the_default_limit_admits_a_body_of_7_mib() -> None:
    """The default is meant to be big enough for the largest context."""
    gateway = Gateway()
    assert gateway.post(CHAT, _sized_chat(7 * 1024 * 1024)).status_code == 200


def test_a_configured_body_limit_is_honoured_to_the_byte() -> None:
    gateway = Gateway(max_body_bytes=4096)
    assert gateway.post(CHAT, _sized_chat(4096)).status_code == 200
    response = gateway.post(CHAT, _sized_chat(4097))
    assert_openai_error(response, 413)
    assert response.json()["error"]["code"] == "body_too_large"
    assert len(gateway.engine.bodies) == 1


def test_bad_requests_are_counted_and_none_is_an_internal_error() -> None:
    gateway = Gateway()
    sent = {CHAT: 0, COMPLETIONS: 0}
    for crafted in CRAFTED.values():
        assert gateway.post(crafted.path, crafted.body).status_code == crafted.status
        sent[crafted.path] += 1
    text = gateway.metrics()
    for route, count in sent.items():
        assert metric_sum(text, "llmfleet_gateway_bad_requests_total", route=route) == count
    assert metric_sum(text, "llmfleet_gateway_internal_errors_total") == 0


def test_an_unexpected_exception_is_a_500_in_openai_shape_counted_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gateway = Gateway()
    gateway.discovery.broken = True
    with caplog.at_level(logging.ERROR):
        response = gateway.post(CHAT, _chat_with(), {"x-request-id": "req-boom"})
    assert_openai_error(response, 500)
    assert response.headers["x-request-id"] == "req-boom"
    tracebacks = [r for r in caplog.records if r.exc_info is not None]
    assert len(tracebacks) == 1, [r.getMessage() for r in caplog.records]
    assert "req-boom" in tracebacks[0].getMessage()
    text = gateway.metrics()
    assert metric_sum(text, "llmfleet_gateway_internal_errors_total", route=CHAT) == 1
    gateway.discovery.broken = False
    gateway.serves_a_normal_request()
