"""Acceptance: the official openai client, sync and async, streaming and not, against the
gateway with two llm-d-inference-sim engines behind it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from llmfleet.gateway.discovery import Pool, Service, StaticDiscovery
from tests.gateway.servers import ThreadServer, gateway, sims

MODEL = "test-model"


@pytest.fixture(scope="module")
def engines(sim_binary: Path) -> Iterator[list[str]]:
    with sims(sim_binary, MODEL, 2, "--mode", "echo") as started:
        yield [sim.url for sim in started]


@pytest.fixture(scope="module")
def server(engines: list[str]) -> Iterator[ThreadServer]:
    service = Service(MODEL, "default", "svc", {"unified": Pool("unified", tuple(engines))})
    with gateway(StaticDiscovery({MODEL: service})) as running:
        yield running


@pytest.fixture
def client(server: ThreadServer) -> Iterator[openai.OpenAI]:
    """Closed after the test: its socket is not left to a garbage collection in a later one."""
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as sdk:
        yield sdk


MESSAGES = [{"role": "user", "content": "say hello back"}]


def test_sync_chat(server: ThreadServer, engines: list[str], client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=8,  # type: ignore[arg-type]
    )
    completion = raw.parse()
    assert completion.choices[0].message.content == "say hello back"  # echo mode
    assert completion.usage is not None
    assert completion.usage.completion_tokens > 0
    assert raw.headers["x-llmfleet-pool"] == "unified"
    assert raw.headers["x-llmfleet-endpoint"] in engines
    assert raw.headers["x-request-id"]


def test_sync_stream_has_usage_in_last_chunk(server: ThreadServer, client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip() == "say hello back"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.total_tokens > 0
    assert all(c.usage is None for c in chunks[:-1])


def test_sync_completions(server: ThreadServer, client: openai.OpenAI) -> None:
    completion = client.completions.create(model=MODEL, prompt="one two", max_tokens=4)
    assert completion.choices[0].text
    assert completion.usage is not None


def test_async_chat_and_stream(server: ThreadServer) -> None:
    async def run() -> tuple[str | None, int | None]:
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        async with client:
            plain = await client.chat.completions.create(
                model=MODEL,
                messages=MESSAGES,
                max_tokens=8,  # type: ignore[arg-type]
            )
            stream = await client.completions.create(
                model=MODEL,
                prompt="count with me",
                max_tokens=5,
                stream=True,
                stream_options={"include_usage": True},
            )
            last = None
            async for chunk in stream:
                last = chunk
            assert last is not None
            assert last.usage is not None
            return plain.choices[0].message.content, last.usage.completion_tokens

    content, tokens = asyncio.run(run())
    assert content == "say hello back"
    assert tokens is not None
    assert tokens > 0


def test_models_lists_served_names(server: ThreadServer, client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        pytest.param(
            {"model": "nope", "messages": MESSAGES}, 404, "does not exist", id="unknown-model"
        ),
        pytest.param({"messages": MESSAGES}, 400, "model", id="no-model"),
        pytest.param({"model": MODEL, "messages": []}, 400, "messages", id="empty-messages"),
        pytest.param(
            {"model": MODEL, "messages": MESSAGES, "max_tokens": 0},
            400,
            "max_tokens",
            id="zero-max-tokens",
        ),
        pytest.param([1, 2], 400, "JSON object", id="not-an-object"),
    ],
)
def test_errors_have_openai_shape(
    server: ThreadServer, body: object, status: int, fragment: str
) -> None:
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=10)
    assert response.status_code == status
    error = response.json()["error"]
    assert fragment in error["message"]
    assert set(error) == {"message", "type", "param", "code"}


def test_health_ready_metrics(server: ThreadServer) -> None:
    assert httpx.get(f"{server.url}/healthz").status_code == 200
    assert httpx.get(f"{server.url}/readyz").status_code == 200
    metrics = httpx.get(f"{server.url}/metrics").text
    assert 'llmfleet_gateway_requests_total{model="test-model",namespace="default"' in metrics
    assert "llmfleet_gateway_overhead_seconds_bucket" in metrics
    assert httpx.get(f"{server.url}/openapi.json").json()["paths"]["/v1/chat/completions"]
    assert httpx.get(f"{server.url}/nowhere").json()["error"]["message"] == "Not Found"
