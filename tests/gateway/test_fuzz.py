"""Whatever a client sends, the gateway itself answers below 500, in OpenAI's error shape, with
an `x-request-id`.

Hypothesis generates bodies (arbitrary JSON, near-valid requests with wrongly typed fields,
raw bytes, and hostile bodies: deep nesting, lone surrogates, numbers beyond any range, big
strings, invalid UTF-8) and request ids of arbitrary bytes; the app runs in-process over
`httpx.ASGITransport`, its engines are an `httpx.MockTransport` that always answers 200, so any
5xx would be the gateway's own. `test_schemathesis.py` fuzzes the declared API the same way.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from llmfleet.gateway.app import create_app
from llmfleet.gateway.discovery import Pool, Service, StaticDiscovery
from llmfleet.gateway.settings import GatewaySettings

ENGINE_ANSWER = {"id": "x", "object": "chat.completion", "choices": [], "usage": None}


def _engine(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json=ENGINE_ANSWER)


_SERVICE = Service("m", "ns", "svc", {"unified": Pool("unified", ("http://127.0.0.1:8001",))})
_APP = create_app(
    GatewaySettings(),
    discovery=StaticDiscovery({"m": _SERVICE}),
    transport=httpx.MockTransport(_engine),
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
near_valid = st.fixed_dictionaries(
    {"model": st.sampled_from(["m", "other", ""]) | json_values},
    optional={
        "messages": st.lists(
            st.fixed_dictionaries({"role": st.text(), "content": json_values}), max_size=3
        )
        | json_values,
        "prompt": st.text() | st.lists(st.integers()) | json_values,
        "stream": st.booleans() | json_values,
        "max_tokens": st.integers(-5, 10**12) | json_values,
        "max_completion_tokens": st.integers(-5, 100) | json_values,
        "stream_options": json_values,
    },
)


async def _post(path: str, content: bytes, request_id: bytes | None = None) -> httpx.Response:
    headers = [(b"content-type", b"application/json")]
    if request_id is not None:
        headers.append((b"x-request-id", request_id))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(_APP), base_url="http://gw") as c:
        return await c.post(path, content=content, headers=headers)


def _check(response: httpx.Response) -> None:
    assert response.status_code < 500, response.text[:500]
    echoed = [value for name, value in response.headers.raw if name.lower() == b"x-request-id"]
    assert len(echoed) == 1, f"x-request-id headers: {echoed}"
    assert echoed[0].isascii(), echoed
    if response.status_code >= 400:
        error: dict[str, Any] = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    path=st.sampled_from(["/v1/chat/completions", "/v1/completions"]),
    body=near_valid | json_values,
)
@example(  # streamed from a transport that already read the body (found by hypothesis)
    path="/v1/chat/completions", body={"model": "m", "stream": True, "messages": [{"role": ""}]}
)
def test_json_bodies_never_5xx(path: str, body: object) -> None:
    _check(asyncio.run(_post(path, json.dumps(body).encode())))


@settings(max_examples=50, deadline=None)
@given(content=st.binary(max_size=200))
def test_raw_bytes_never_5xx(content: bytes) -> None:
    _check(asyncio.run(_post("/v1/chat/completions", content)))


def _nested(depth: int, shape: tuple[bytes, bytes, bytes]) -> bytes:
    opener, leaf, closer = shape
    return opener * depth + leaf + closer * depth


hostile_values = st.one_of(
    st.builds(
        _nested,
        st.integers(500, 120_000),
        st.sampled_from([(b"[", b"", b"]"), (b'{"a":', b"1", b"}"), (b"[{", b"", b"}]")]),
    ),
    st.sampled_from([b'"\\ud800"', b'"a\\udfffb"', b'"\\udc00\\ud800"', b'"\\ud83d x"']),
    st.builds(
        lambda sign, digits: sign + b"9" * digits,
        st.sampled_from([b"", b"-"]),
        st.integers(19, 5_000),  # past 4,300 digits Python's int() refuses the text
    ),
    st.sampled_from([b"1e400", b"-1e400", b"NaN", b"Infinity", b"-Infinity", b"1e-400", b"-0.0"]),
    st.builds(
        lambda piece, count: b'"' + piece * count + b'"',
        st.sampled_from([b"a", "\u00e9".encode(), b"\\u00e9", b"\\n", b"\\u0000", b"\\\\"]),
        st.integers(0, 1_000_000),
    ),
    st.sampled_from([b'"\xff"', b'"\xc3"', b'"\xed\xa0\x80"', b'"a\x80b"']),  # invalid UTF-8
    json_values.map(lambda value: json.dumps(value).encode()),
)
"""JSON values (as bytes) a client should not send: each goes into one field of a request."""
ordinary_values = st.sampled_from([b'"m"', b'"hi"', b"1", b"16", b"0.5", b"true", b"null"])
fields = st.sampled_from(
    [b"stream", b"max_tokens", b"max_completion_tokens", b"n", b"temperature", b"user",
     b"stream_options", b"extra"]
)  # fmt: skip


@st.composite
def hostile_bodies(draw: st.DrawFn) -> tuple[str, bytes]:
    """A request with a hostile value in one place (model, prompt or content, another field)."""
    chat = draw(st.booleans())
    where = draw(st.sampled_from(["model", "prompt", "field"]))
    hostile = draw(hostile_values)
    model = hostile if where == "model" else b'"m"'
    prompt = hostile if where == "prompt" else b'"hi"'
    name = draw(fields)
    value = hostile if where == "field" else draw(ordinary_values)
    if chat:
        head = b'{"model":' + model + b',"messages":[{"role":"user","content":' + prompt + b"}]"
        return "/v1/chat/completions", head + b',"' + name + b'":' + value + b"}"
    head = b'{"model":' + model + b',"prompt":' + prompt
    return "/v1/completions", head + b',"' + name + b'":' + value + b"}"


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request=hostile_bodies())
@example(request=("/v1/chat/completions", b'{"model":"m","messages":[{"role":"user","content":'
                  + _nested(100_000, (b"[", b"", b"]")) + b"}]}"))  # fmt: skip
@example(request=("/v1/completions", b'{"model":"m","prompt":"\\ud800"}'))
@example(request=("/v1/chat/completions", b'{"model":"m","messages":[{"role":"user","content":'
                  b'"hi"}],"max_tokens":' + b"9" * 400 + b"}"))  # fmt: skip
def test_hostile_bodies_never_5xx(request: tuple[str, bytes]) -> None:
    path, body = request
    _check(asyncio.run(_post(path, body)))


@settings(max_examples=60, deadline=None)
@given(request_id=st.binary(min_size=1, max_size=64))
@example(request_id="é".encode("latin-1"))
@example(request_id="请求".encode())
def test_any_request_id_bytes_are_echoed_as_ascii_never_5xx(request_id: bytes) -> None:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    _check(asyncio.run(_post("/v1/chat/completions", body, request_id)))
