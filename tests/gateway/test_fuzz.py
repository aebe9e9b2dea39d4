"""Whatever a client sends, the gateway itself answers below 500, in OpenAI's error shape.

Hypothesis generates bodies (arbitrary JSON, near-valid requests with wrongly typed fields,
raw bytes); the app runs in-process over `httpx.ASGITransport`, its engines are an
`httpx.MockTransport` that always answers 200, so any 5xx would be the gateway's own.
(Stands in for schemathesis, which is not among our dependencies.)
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


async def _post(path: str, content: bytes) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(_APP), base_url="http://gw") as c:
        return await c.post(path, content=content, headers={"content-type": "application/json"})


def _check(response: httpx.Response) -> None:
    assert response.status_code < 500, response.text
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
