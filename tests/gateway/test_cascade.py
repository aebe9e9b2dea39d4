"""Acceptance: model cascading (`traffic.cascade`) through the real gateway.

Three services of namespace `ns`: `cheap` and `large`, and `assistant`, which cascades to
`cheap` first and is served by the large engine itself. Both engines are `LogprobEngine`
stand-ins (real HTTP servers on 127.0.0.1), because the simulator's logprobs are fixed (see
`logprob_engine`); the last test puts llm-d-inference-sim in as the cheap tier to show that the
gateway reads a real engine's logprobs, judged against thresholds on either side of its fixed
confidence (about 0.33).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from llmfleet.crds.policy import CascadeSpec, CascadeTier, TrafficSpec
from llmfleet.gateway.discovery import Pool, Service, StaticDiscovery
from tests.gateway.logprob_engine import LogprobEngine
from tests.gateway.servers import Sim, ThreadServer, gateway

NS = "ns"
MODEL = "assistant"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
SURE, UNSURE = 0.95, 0.3
"""Token probabilities of a confident and an unsure cheap answer (threshold 0.7)."""
CHEAP_TIER = CascadeTier(service="cheap", escalate_below_confidence=0.7, max_prompt_tokens=50)


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[LogprobEngine, LogprobEngine, str, str]]:
    cheap, large = LogprobEngine("cheap"), LogprobEngine("large")
    with ThreadServer(cheap.app()) as c, ThreadServer(large.app()) as g:
        yield cheap, large, c.url, g.url


@pytest.fixture
def cheap(engines: tuple[LogprobEngine, LogprobEngine, str, str]) -> LogprobEngine:
    engines[0].reset()
    return engines[0]


@pytest.fixture
def large(engines: tuple[LogprobEngine, LogprobEngine, str, str]) -> LogprobEngine:
    engines[1].reset()
    return engines[1]


def _fleet(cascade: CascadeSpec, cheap_url: str, large_url: str) -> StaticDiscovery:
    def service(model: str, name: str, url: str, spec: CascadeSpec | None = None) -> Service:
        traffic = TrafficSpec(cascade=spec or CascadeSpec())
        return Service(model, NS, name, {"unified": Pool("unified", (url,))}, traffic)

    return StaticDiscovery(
        {
            "cheap-model": service("cheap-model", "cheap", cheap_url),
            "large-model": service("large-model", "large", large_url),
            MODEL: service(MODEL, MODEL, large_url, cascade),
        }
    )


@contextlib.contextmanager
def _gateway(
    engines: tuple[LogprobEngine, LogprobEngine, str, str], **cascade: Any
) -> Iterator[ThreadServer]:
    spec = CascadeSpec(**{"tiers": [CHEAP_TIER], **cascade})
    with gateway(_fleet(spec, engines[2], engines[3])) as server:
        yield server


def _metric(server: ThreadServer, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    total = 0.0
    for line in httpx.get(f"{server.url}/metrics").text.splitlines():
        match = re.match(rf"^{name}\{{(.*)\}} (\S+)$", line)
        if match is None:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(match.group(2))
    return total


def _body(path: str, text: str = "say hi", **extra: Any) -> dict[str, Any]:
    if path == CHAT:
        return {"model": MODEL, "messages": [{"role": "user", "content": text}], **extra}
    return {"model": MODEL, "prompt": text, **extra}


def _text(path: str, answer: dict[str, Any]) -> str:
    choice = answer["choices"][0]
    return str(choice["message"]["content"] if path == CHAT else choice["text"])


@pytest.mark.parametrize(
    ("path", "probability", "tier"),
    [
        pytest.param(CHAT, UNSURE, "assistant", id="chat-unsure-escalates"),
        pytest.param(CHAT, SURE, "cheap", id="chat-sure-served-by-cheap"),
        pytest.param(COMPLETIONS, UNSURE, "assistant", id="completions-unsure-escalates"),
        pytest.param(COMPLETIONS, SURE, "cheap", id="completions-sure-served-by-cheap"),
    ],
)
def test_cheap_tier_answers_unless_unsure(
    engines: Any,
    *,
    cheap: LogprobEngine,
    large: LogprobEngine,
    path: str,
    probability: float,
    tier: str,
) -> None:
    cheap.reset(probability=probability)
    with _gateway(engines) as server:
        response = httpx.post(server.url + path, json=_body(path), timeout=10)
        escalations = _metric(
            server, "llmfleet_gateway_cascade_escalations_total", tier="cheap",
            reason="low_confidence",
        )  # fmt: skip
        served = _metric(
            server, "llmfleet_gateway_cascade_served_total", tier=tier,
            escalated=str(tier != "cheap").lower(),
        )  # fmt: skip
        judged = _metric(server, "llmfleet_gateway_cascade_confidence_count", tier="cheap")
        low = _metric(server, "llmfleet_gateway_cascade_confidence_bucket", tier="cheap", le="0.4")
    assert response.status_code == 200
    escalated = tier != "cheap"
    assert response.headers["x-llmfleet-tier"] == tier
    assert response.headers["x-llmfleet-escalated"] == str(escalated).lower()
    answer = response.json()
    assert _text(path, answer) == "".join((large if escalated else cheap).words())
    assert answer["choices"][0].get("logprobs") is None  # the caller did not ask
    # the cheap tier was asked for logprobs, under its own model name
    assert len(cheap.received) == 1
    assert cheap.received[0]["model"] == "cheap-model"
    assert cheap.received[0]["logprobs"] == (True if path == CHAT else 1)
    # the service itself got the caller's body, untouched, only when the cheap answer was unsure
    assert large.received == ([_body(path)] if escalated else [])
    assert (escalations, served, judged) == (float(escalated), 1.0, 1.0)
    assert low == float(probability < 0.4)  # the histogram holds the confidence, 0.3 or 0.95


def test_openai_client_gets_the_cheap_answer_without_logprobs(
    engines: Any, cheap: LogprobEngine, large: LogprobEngine
) -> None:
    cheap.reset(probability=SURE)
    with (
        _gateway(engines) as server,
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as client,
    ):  # the client closed: its socket is not left to a garbage collection in a later test
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "say hi"}]
        )
    completion = raw.parse()
    assert raw.headers["x-llmfleet-tier"] == "cheap"
    assert raw.headers["x-llmfleet-escalated"] == "false"
    assert completion.choices[0].message.content == "".join(cheap.words())
    assert completion.choices[0].logprobs is None
    assert large.received == []


def test_logprobs_the_caller_asked_for_are_kept(
    engines: Any, cheap: LogprobEngine, large: LogprobEngine
) -> None:
    cheap.reset(probability=SURE)
    with (
        _gateway(engines) as server,
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as client,
    ):
        completion = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "say hi"}], logprobs=True
        )
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.content is not None
    assert [t.token for t in logprobs.content] == cheap.words()
    assert all(t.logprob == pytest.approx(math.log(SURE)) for t in logprobs.content)


@pytest.mark.parametrize(
    ("text", "headers", "reason"),
    [
        pytest.param("word " * 60, {}, "long_prompt", id="long-prompt"),
        pytest.param("Please EXPLAIN this.", {}, "keyword", id="keyword-any-case"),
        pytest.param("say hi", {"x-llmfleet-tier": "large"}, "header", id="tier-header"),
        pytest.param("I explained it", {}, None, id="not-a-whole-word-goes-to-cheap"),
    ],
)
def test_heuristics_skip_the_cheap_tier(
    engines: Any,
    *,
    cheap: LogprobEngine,
    large: LogprobEngine,
    text: str,
    headers: dict[str, str],
    reason: str | None,
) -> None:
    cheap.reset(probability=SURE)
    with _gateway(engines) as server:
        response = httpx.post(
            server.url + CHAT, json=_body(CHAT, text), headers=headers, timeout=10
        )
        skipped = _metric(server, "llmfleet_gateway_cascade_skipped_total", tier="cheap")
        by_reason = _metric(
            server, "llmfleet_gateway_cascade_skipped_total", tier="cheap", reason=reason or "-"
        )
    assert response.status_code == 200
    assert response.headers["x-llmfleet-escalated"] == "false"
    if reason is None:
        assert response.headers["x-llmfleet-tier"] == "cheap"
        assert (len(cheap.received), len(large.received), skipped) == (1, 0, 0.0)
    else:
        assert response.headers["x-llmfleet-tier"] == MODEL
        assert (len(cheap.received), len(large.received), by_reason) == (0, 1, 1.0)


def test_failing_cheap_tier_escalates(
    engines: Any, cheap: LogprobEngine, large: LogprobEngine
) -> None:
    cheap.reset(status=500)
    with _gateway(engines) as server:
        response = httpx.post(server.url + CHAT, json=_body(CHAT), timeout=10)
        failed = _metric(server, "llmfleet_gateway_cascade_escalations_total", reason="tier_failed")
    assert response.status_code == 200
    assert response.headers["x-llmfleet-tier"] == MODEL
    assert response.headers["x-llmfleet-escalated"] == "true"
    assert failed == 1.0


def test_two_unsure_tiers_escalate_to_the_service(
    engines: Any, cheap: LogprobEngine, large: LogprobEngine
) -> None:
    cheap.reset(probability=UNSURE)
    large.reset(probability=0.6)
    tiers = [CHEAP_TIER, CascadeTier(service="large", escalate_below_confidence=0.8)]
    with _gateway(engines, tiers=tiers) as server:
        response = httpx.post(server.url + CHAT, json=_body(CHAT), timeout=10)
        escalations = _metric(server, "llmfleet_gateway_cascade_escalations_total")
    assert response.headers["x-llmfleet-tier"] == MODEL
    assert response.headers["x-llmfleet-escalated"] == "true"
    # the large engine answered twice: once as the `large` tier (with logprobs), once as itself
    assert [body["model"] for body in large.received] == ["large-model", MODEL]
    assert escalations == 2.0


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_hedge_confident_cheap_answer_cancels_the_large_one(
    engines: Any, cheap: LogprobEngine, large: LogprobEngine, stream: bool
) -> None:
    cheap.reset(probability=SURE)
    if stream:  # the large stream opens at once and goes on for 20 s unless closed
        large.reset(tokens=200, token_interval=0.1)
    else:
        large.reset(delay=20)
    with _gateway(engines, hedge=True) as server:
        body = _body(CHAT, "analyze this", stream=stream)
        response = httpx.post(server.url + CHAT, json=body, timeout=10)
        assert large.client_left.wait(5), "the large engine never saw its client leave"
        hedged = _metric(server, "llmfleet_gateway_cascade_hedged_total", winner="cheap")
        # the loser's upstream request was ended, not left to the garbage collector
        in_flight = _metric(server, "llmfleet_gateway_in_flight_requests")
    assert response.status_code == 200
    assert response.headers["x-llmfleet-tier"] == "cheap"
    assert response.headers["x-llmfleet-escalated"] == "false"
    assert (len(cheap.received), len(large.received), hedged, in_flight) == (1, 1, 1.0, 0.0)


def test_hedge_large_answer_first_cancels_the_cheap_one(
    engines: Any, cheap: LogprobEngine, large: LogprobEngine
) -> None:
    cheap.reset(probability=SURE, delay=20)
    with _gateway(engines, hedge=True) as server:
        response = httpx.post(server.url + CHAT, json=_body(CHAT, "analyze this"), timeout=10)
        assert cheap.client_left.wait(5), "the cheap engine never saw its client leave"
        hedged = _metric(server, "llmfleet_gateway_cascade_hedged_total", winner="large")
    assert response.headers["x-llmfleet-tier"] == MODEL
    assert response.headers["x-llmfleet-escalated"] == "false"
    assert response.json()["choices"][0]["message"]["content"] == "".join(large.words())
    assert hedged == 1.0


def test_hedge_unsure_cheap_answer_waits_for_the_large_one(
    engines: Any, cheap: LogprobEngine, large: LogprobEngine
) -> None:
    cheap.reset(probability=UNSURE)
    large.reset(delay=0.5)
    with _gateway(engines, hedge=True) as server:
        response = httpx.post(server.url + CHAT, json=_body(CHAT, "analyze this"), timeout=10)
        hedged = _metric(server, "llmfleet_gateway_cascade_hedged_total", winner="large")
    assert response.headers["x-llmfleet-tier"] == MODEL
    assert response.headers["x-llmfleet-escalated"] == "true"
    assert not large.client_left.is_set()
    assert hedged == 1.0


def _events(response: httpx.Response) -> list[Any]:
    return [
        line[6:] if line == "data: [DONE]" else json.loads(line[6:])
        for line in response.iter_lines()
        if line.startswith("data: ")
    ]


@pytest.mark.parametrize("asked", [False, True], ids=["logprobs-stripped", "logprobs-asked"])
def test_stream_of_the_cheap_tier_is_buffered_then_replayed(
    engines: Any, cheap: LogprobEngine, large: LogprobEngine, asked: bool
) -> None:
    cheap.reset(probability=SURE, tokens=5, token_interval=0.05)
    body = _body(CHAT, stream=True, **({"logprobs": True} if asked else {}))
    finished_at_first_byte = None
    with (
        _gateway(engines) as server,
        httpx.stream("POST", server.url + CHAT, json=body, timeout=10) as response,
    ):
        lines = response.iter_lines()
        first = next(lines)
        finished_at_first_byte = cheap.finished.is_set()
        rest = list(lines)
    assert first.startswith("data: ")
    # nothing reached the client before the cheap engine had produced its whole answer
    assert finished_at_first_byte
    assert response.headers["x-llmfleet-tier"] == "cheap"
    assert response.headers["x-llmfleet-escalated"] == "false"
    events = [json.loads(first[6:])] + [
        line[6:] if line == "data: [DONE]" else json.loads(line[6:])
        for line in rest
        if line.startswith("data: ")
    ]
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == "".join(cheap.words())
    with_logprobs = [c for c in chunks if c["choices"][0].get("logprobs")]
    assert len(with_logprobs) == (5 if asked else 0)
    assert large.received == []


def test_unsure_stream_escalates_to_the_live_stream_of_the_service(
    engines: Any, cheap: LogprobEngine, large: LogprobEngine
) -> None:
    cheap.reset(probability=UNSURE)
    with (
        _gateway(engines) as server,
        httpx.stream(
            "POST", server.url + COMPLETIONS, json=_body(COMPLETIONS, stream=True), timeout=10
        ) as response,
    ):
        events = _events(response)
    assert response.headers["x-llmfleet-tier"] == MODEL
    assert response.headers["x-llmfleet-escalated"] == "true"
    assert events[-1] == "[DONE]"
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == "".join(large.words())
    assert large.received == [_body(COMPLETIONS, stream=True)]


def test_each_decision_is_logged_with_the_request_id(
    engines: Any, cheap: LogprobEngine, large: LogprobEngine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="llmfleet.gateway.policies")
    cheap.reset(probability=UNSURE)
    with _gateway(engines) as server:
        httpx.post(
            server.url + CHAT, json=_body(CHAT), headers={"x-request-id": "r-42"}, timeout=10
        )
    lines = [r.getMessage() for r in caplog.records if "cascade" in r.getMessage()]
    assert lines == [
        "request_id=r-42 cascade served tier=assistant escalated=true confidence=cheap:0.300 "
        "skipped=- hedged=false"
    ]


@pytest.mark.parametrize(
    ("threshold", "tier"),
    [
        pytest.param(0.2, "cheap", id="sim-above-threshold-served"),
        pytest.param(0.5, MODEL, id="sim-below-threshold-escalates"),
    ],
)
def test_simulator_logprobs_are_judged(
    sim_binary: Path, engines: Any, large: LogprobEngine, threshold: float, tier: str
) -> None:
    sim = Sim(sim_binary, "cheap-model")
    try:
        tiers = [CascadeTier(service="cheap", escalate_below_confidence=threshold)]
        spec = CascadeSpec(tiers=tiers)
        with gateway(_fleet(spec, sim.url, engines[3])) as server:
            response = httpx.post(server.url + CHAT, json=_body(CHAT, max_tokens=12), timeout=10)
            judged = _metric(server, "llmfleet_gateway_cascade_confidence_sum", tier="cheap")
    finally:
        sim.kill()
    assert response.status_code == 200
    assert response.headers["x-llmfleet-tier"] == tier
    # the simulator's tokens cycle through logprobs -1.0, -1.1, -1.2
    assert judged == pytest.approx(sum(math.exp(-v) for v in (1.0, 1.1, 1.2)) / 3, abs=0.04)
    if tier == "cheap":
        assert response.json()["choices"][0].get("logprobs") is None
