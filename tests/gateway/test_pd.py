"""Disaggregated serving: prefill then decode, with the kv_transfer_params hand-off.

Two engines of each kind: llm-d-inference-sim (it implements the prefill side of the protocol:
with `do_remote_decode` it answers `kv_transfer_params`, and as decode it accepts them), and the
stand-in, which records the exact bodies both calls carried.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import openai

from llmfleet.gateway.discovery import Pool, Service, StaticDiscovery
from llmfleet.gateway.pd import PREFILL_KV_PARAMS
from tests.gateway.servers import ThreadServer, gateway, sims, wait_for
from tests.gateway.standin import StandIn

MODEL = "pd-model"


def _service(prefill: list[str], decode: list[str]) -> StaticDiscovery:
    pools = {"prefill": Pool("prefill", tuple(prefill)), "decode": Pool("decode", tuple(decode))}
    return StaticDiscovery({MODEL: Service(MODEL, "default", "pd", pools)})


def _success_count(url: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:request_success_total")
    )


def test_pd_with_simulators(sim_binary: Path) -> None:
    with (
        sims(sim_binary, MODEL, 2) as (prefill, decode),
        gateway(_service([prefill.url], [decode.url])) as server,
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="-", max_retries=0) as client,
    ):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(raw.parse())
        served = wait_for(
            lambda: (
                (_success_count(prefill.url), _success_count(decode.url))
                if _success_count(decode.url) and _success_count(prefill.url)
                else None
            ),
            30,
            "both engines to count the request (the simulator updates its metrics apart)",
        )
    assert served == (1, 1)  # one call each: the prefill step and the decode step
    assert raw.headers["x-llmfleet-pool"] == "decode"
    assert raw.headers["x-llmfleet-endpoint"] == decode.url
    assert raw.headers["x-llmfleet-prefill-endpoint"] == prefill.url
    assert chunks[-1].usage is not None
    assert 0 < chunks[-1].usage.completion_tokens <= 6


def test_pd_hands_kv_transfer_params_from_prefill_to_decode() -> None:
    prefill, decode = StandIn("p"), StandIn("d")
    with (
        ThreadServer(prefill.app()) as p,
        ThreadServer(decode.app()) as d,
        gateway(_service([p.url], [d.url])) as server,
    ):
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 50,
            "stream": True,
            "stream_options": {"include_usage": True},
            "top_k": 7,  # an engine extension the gateway must forward untouched
        }
        response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=10)
    assert response.status_code == 200
    assert "data: [DONE]" in response.text
    [first] = prefill.received
    assert first["max_tokens"] == 1
    assert first["stream"] is False
    assert first.get("stream_options") is None  # spliced in as null, not removed
    assert first["kv_transfer_params"] == PREFILL_KV_PARAMS
    assert first["top_k"] == 7
    [second] = decode.received
    assert second["kv_transfer_params"]["remote_engine_id"] == "engine-p"
    assert second["kv_transfer_params"]["remote_block_ids"] == [1, 2, 3]
    assert {k: v for k, v in second.items() if k != "kv_transfer_params"} == body


def test_pd_without_prefill_endpoints_decodes_alone() -> None:
    decode = StandIn("d")
    with ThreadServer(decode.app()) as d, gateway(_service([], [d.url])) as server:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=10)
    assert response.status_code == 200
    assert response.headers["x-llmfleet-prefill-endpoint"] == "none"
    assert "kv_transfer_params" not in decode.received[0]


def test_pd_without_decode_endpoints_is_503() -> None:
    prefill = StandIn("p")
    with ThreadServer(prefill.app()) as p, gateway(_service([p.url], [])) as server:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=10)
    assert response.status_code == 503
    assert "no serving decode endpoint" in response.json()["error"]["message"]
    assert prefill.received == []


def test_pd_prefill_without_kv_params_is_a_clear_502() -> None:
    prefill, decode = StandIn("p", kv_connector=False), StandIn("d")
    with (
        ThreadServer(prefill.app()) as p,
        ThreadServer(decode.app()) as d,
        gateway(_service([p.url], [d.url])) as server,
    ):
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=10)
    assert response.status_code == 502
    assert "kv_transfer_params" in response.json()["error"]["message"]
    assert decode.received == []
