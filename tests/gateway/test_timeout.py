"""`limits.timeoutSeconds` as a deadline: streams end cleanly with finish_reason "length",
non-streaming requests get a 504 (or, with `partialAnswers`, what was generated in time).

The engine is llm-d-inference-sim, slowed down per token so that a 60-token answer takes 3 s
and the service's 1 s timeout cuts it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from llmfleet.crds.policy import LimitsSpec, TrafficSpec
from llmfleet.gateway.discovery import Pool, Service, StaticDiscovery
from tests.gateway.servers import Sim, ThreadServer, gateway

MODEL = "m"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "tell me a long story"}]}


def _service(url: str, limits: LimitsSpec) -> StaticDiscovery:
    pool = Pool("unified", (url,))
    return StaticDiscovery(
        {MODEL: Service(MODEL, "ns", "svc", {"unified": pool}, TrafficSpec(limits=limits))}
    )


@pytest.fixture(scope="module")
def slow_sim(sim_binary: Path) -> Iterator[Sim]:
    sim = Sim(sim_binary, MODEL, "--inter-token-latency", "50ms", "--mode", "random")
    try:
        yield sim
    finally:
        sim.kill()


def _events(text: str) -> list[str]:
    return [line[6:] for line in text.splitlines() if line.startswith("data: ")]


def _truncated(server: ThreadServer, kind: str) -> float:
    text = httpx.get(f"{server.url}/metrics").text
    pattern = rf'^llmfleet_gateway_truncated_total\{{[^}}]*kind="{kind}"[^}}]*\}} (\S+)$'
    return sum(float(value) for value in re.findall(pattern, text, re.MULTILINE))


def test_a_stream_cut_by_the_timeout_ends_with_finish_reason_length(slow_sim: Sim) -> None:
    body = {**CHAT, "stream": True, "max_tokens": 60, "ignore_eos": True}
    with gateway(_service(slow_sim.url, LimitsSpec(timeout_seconds=1.0))) as server:
        response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=10)
        assert _truncated(server, "stream") == 1
    assert response.status_code == 200
    events = _events(response.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert all("error" not in chunk for chunk in chunks)
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert content, "what was generated before the timeout reaches the client"
    last = chunks[-1]
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["x_llmfleet_truncated"] == "timeout"
    assert last["id"] == chunks[0]["id"]
    assert ": x-llmfleet-truncated: timeout" in response.text
    # a 60-token answer at 50 ms a token would take 3 s: fewer tokens arrived
    assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")) < 60


def test_the_openai_client_reads_a_cut_stream_without_an_error(slow_sim: Sim) -> None:
    with (
        gateway(_service(slow_sim.url, LimitsSpec(timeout_seconds=1.0))) as server,
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0) as client,
    ):
        stream = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "go on"}],
            max_tokens=60,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        reasons = [chunk.choices[0].finish_reason for chunk in stream if chunk.choices]
    assert reasons[-1] == "length"
    assert reasons.count("length") == 1


def test_a_stream_within_its_timeout_is_untouched(slow_sim: Sim) -> None:
    body = {**CHAT, "stream": True, "max_tokens": 5, "ignore_eos": True}
    with gateway(_service(slow_sim.url, LimitsSpec(timeout_seconds=5.0))) as server:
        response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=10)
        assert _truncated(server, "stream") == 0
    assert "x-llmfleet-truncated" not in response.text
    chunks = [json.loads(event) for event in _events(response.text)[:-1]]
    assert "x_llmfleet_truncated" not in chunks[-1]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"


def test_a_non_streaming_request_past_its_timeout_is_a_504_that_says_so(slow_sim: Sim) -> None:
    body = {**CHAT, "max_tokens": 60, "ignore_eos": True}
    with gateway(_service(slow_sim.url, LimitsSpec(timeout_seconds=1.0))) as server:
        response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=10)
        assert _truncated(server, "timeout") == 1
    assert response.status_code == 504
    error = response.json()["error"]
    assert error["code"] == "timeout"
    assert "timeout (1 s)" in error["message"]


def test_partial_answers_return_what_was_generated_in_time(slow_sim: Sim) -> None:
    limits = LimitsSpec(timeout_seconds=1.0, partial_answers=True)
    with (
        gateway(_service(slow_sim.url, limits)) as server,
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0) as client,
    ):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": "go on"}],
            max_tokens=60,
            extra_body={"ignore_eos": True},
        )
        completion = raw.parse()
        assert _truncated(server, "partial") == 1
    assert raw.headers["x-llmfleet-truncated"] == "timeout"
    assert completion.object == "chat.completion"
    assert completion.choices[0].finish_reason == "length"
    assert completion.choices[0].message.content


def test_partial_answers_that_finish_in_time_are_whole_completions(slow_sim: Sim) -> None:
    limits = LimitsSpec(timeout_seconds=5.0, partial_answers=True)
    body = {"model": MODEL, "prompt": "once upon a time", "max_tokens": 4, "ignore_eos": True}
    with gateway(_service(slow_sim.url, limits)) as server:
        response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=10)
    assert response.status_code == 200
    assert "x-llmfleet-truncated" not in response.headers
    completion = response.json()
    assert completion["object"] == "text_completion"
    assert completion["choices"][0]["text"]
    assert completion["choices"][0]["finish_reason"] == "length"  # max_tokens reached
    assert completion["usage"]["completion_tokens"] == 4
