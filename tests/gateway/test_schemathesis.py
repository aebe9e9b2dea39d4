"""schemathesis over the gateway's own `/openapi.json`: requests generated from the declared
request bodies (positive: valid per the schema; negative: violating it) for the two completion
routes, and every answer checked against the declared responses.

Checks: no 5xx (`not_a_server_error`); the status is a declared one (`status_code_conformance`),
so each 4xx the gateway can give must be declared; the body and content type match the declared
response (`response_schema_conformance`, `content_type_conformance`), so the declared 4xx must
carry the OpenAI error schema; plus our own: an `x-request-id` on every answer and exactly the
keys `message`, `type`, `param`, `code` in every error.

The app runs in-process over `httpx.ASGITransport` (no server, no lifespan: as `test_fuzz.py`),
its engines an `httpx.MockTransport` answering 200. schemathesis only generates the cases and
validates the answers: its pytest plugin (`@schema.parametrize`) is not used, so the test does
not depend on pytest internals the plugin reaches into.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import Case, GenerationMode, checks
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.schemas import OpenApiSchema
from starlette.types import ASGIApp

from llmfleet.gateway.app import create_app
from llmfleet.gateway.discovery import Pool, Service, StaticDiscovery
from llmfleet.gateway.settings import GatewaySettings

ROUTES = ("/v1/chat/completions", "/v1/completions")
ENGINE_ANSWER = {"id": "x", "object": "chat.completion", "choices": [], "usage": None}
EXAMPLES = 100
"""Cases per route and generation mode (4 runs: a few seconds on one core)."""
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
]


@pytest.fixture(scope="module")
def app() -> ASGIApp:
    service = Service("m", "ns", "svc", {"unified": Pool("unified", ("http://127.0.0.1:8001",))})
    return create_app(
        GatewaySettings(),
        discovery=StaticDiscovery({"m": service}),
        transport=httpx.MockTransport(lambda _: httpx.Response(200, json=ENGINE_ANSWER)),
    )


async def _send(app: ASGIApp, method: str, url: str, **kwargs: Any) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://gw") as c:
        return await c.request(method, url, **kwargs)


@pytest.fixture(scope="module")
def schema(app: ASGIApp) -> OpenApiSchema:
    """The schema the app serves at /openapi.json, as a client would read it."""
    response = asyncio.run(_send(app, "GET", "/openapi.json"))
    assert response.status_code == 200, response.text
    # An explicit config: no schemathesis.toml is looked for.
    return schemathesis.openapi.from_dict(response.json(), config=SchemathesisConfig())


def _call(app: ASGIApp, case: Case) -> httpx.Response:
    """`case` sent to the app: the requests-style arguments schemathesis serialises, in httpx's
    words (`data` is raw bytes; `json` a value to encode)."""
    kwargs = case.as_transport_kwargs(base_url="http://gw")
    body: dict[str, Any] = {}
    if "json" in kwargs:
        body["json"] = kwargs["json"]
    elif kwargs.get("data") is not None:
        body["content"] = kwargs["data"]
    return asyncio.run(
        _send(app, kwargs["method"], kwargs["url"], headers=kwargs["headers"],
              params=kwargs.get("params") or None, **body)
    )  # fmt: skip


def _assert_our_contract(response: httpx.Response) -> None:
    assert response.headers.get("x-request-id"), f"no x-request-id on a {response.status_code}"
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, error


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
@pytest.mark.parametrize("path", ROUTES)
def test_completion_routes_answer_as_declared(
    app: ASGIApp, schema: OpenApiSchema, path: str, mode: GenerationMode
) -> None:
    operation = schema[path]["POST"]

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=[
            HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large
        ],
    )  # fmt: skip
    @given(case=operation.as_strategy(mode))
    def answers_as_declared(case: Case) -> None:
        response = _call(app, case)
        case.validate_response(response, checks=CHECKS)
        _assert_our_contract(response)

    answers_as_declared()


@pytest.mark.parametrize("path", ROUTES)
@pytest.mark.parametrize("status", ["400", "401", "404", "409", "413", "429", "503"])
def test_the_completion_routes_declare_their_errors_in_openai_shape(
    schema: OpenApiSchema, path: str, status: str
) -> None:
    """The error answers are declared, with the error object's four keys (a schema that would
    let the response checks above pass on anything is not enough)."""
    responses = schema.raw_schema["paths"][path]["post"]["responses"]
    assert status in responses, f"{status} is not declared for POST {path}"
    content = responses[status]["content"]["application/json"]["schema"]
    resolved = _resolve(schema.raw_schema, content)
    error = _resolve(schema.raw_schema, resolved["properties"]["error"])
    assert set(error["properties"]) == {"message", "type", "param", "code"}
    assert "error" in resolved.get("required", [])


def _resolve(document: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """`node`, or what its local `$ref` points at."""
    while "$ref" in node:
        target: Any = document
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = target
    return node
