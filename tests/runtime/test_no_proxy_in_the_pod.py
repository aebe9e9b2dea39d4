"""No second proxy in the pod: a request crosses the gateway and nothing else on its way to vLLM.

A disaggregated service as the operator lays it out: a prefill and a decode pod, each a launcher
with its engine (the stand-in, which records which process sent each request), the gateway in
front (`llmfleet gateway --static-config`, a process of its own) pointed at the pods' serving
ports. Every prefill and decode request must arrive from the gateway's process itself; the
warm-up requests, which the launchers send, show that the record tells the two apart. Were a
proxy back in the pod, the engines would see it, not the gateway, on the other end.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.net import free_port, status, wait_for
from tests.runtime.processes import Launcher, Launchers, standin_command, stop

MODEL = "pd-model"
LLMFLEET = Path(sys.executable).parent / "llmfleet"


def _pod(launchers: Launchers, role: str, **serving: float) -> Launcher:
    config = {
        "model": {"name": MODEL},
        "role": role,
        "kvTransfer": {"connector": "NixlConnector"},
        "warmup": {"requests": 1, "maxTokens": 1},
        "serving": {"drainSettleSeconds": 0.5, **serving},
    }
    return launchers.start(standin_command(role), config, {"POD_IP": "127.0.0.1"})


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Any]:
    started: list[subprocess.Popen[bytes]] = []

    def start(prefill: Launcher, decode: Launcher) -> tuple[str, psutil.Process]:
        fleet = {"models": {MODEL: {"prefill": [prefill.engine], "decode": [decode.engine]}}}
        config = tmp_path / "fleet.yaml"
        config.write_text(json.dumps(fleet))
        port = free_port()
        command = [str(LLMFLEET), "gateway", "--static-config", str(config), "--host", "127.0.0.1",
                   "--port", str(port)]  # fmt: skip
        started.append(subprocess.Popen(command, stdout=subprocess.DEVNULL))
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: status(f"{url}/readyz") == 200 or None, 20, "the gateway")
        return url, psutil.Process(started[-1].pid)

    yield start
    for process in started:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        finally:
            stop(process)


def _pd_stream(gateway_url: str, tokens: int) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": tokens, "stream": True}  # fmt: skip
    return httpx.post(f"{gateway_url}/v1/chat/completions", json=body, timeout=30)


def _seen(pod: Launcher) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = httpx.get(f"{pod.engine}/seen").json()
    return records


def _gateway_pids(gateway: psutil.Process) -> set[int]:
    return {gateway.pid} | {child.pid for child in gateway.children(recursive=True)}


def test_pd_requests_reach_the_engines_from_the_gateway_itself(
    launchers: Launchers, gateway: Any
) -> None:
    prefill, decode = _pod(launchers, "prefill"), _pod(launchers, "decode")
    prefill.wait_ready()
    decode.wait_ready()
    url, process = gateway(prefill, decode)

    response = _pd_stream(url, 4)

    assert response.status_code == 200, response.text
    assert response.text.endswith("data: [DONE]\n\n")
    assert response.headers["x-llmfleet-prefill-endpoint"] == prefill.engine
    assert response.headers["x-llmfleet-endpoint"] == decode.engine
    gateway_pids = _gateway_pids(process)
    for pod in (prefill, decode):
        warmup, *served = _seen(pod)
        assert warmup["peer_pid"] == pod.process.pid  # the record tells processes apart
        senders = [record["peer_pid"] for record in served]
        assert len(senders) == 1
        assert senders[0] in gateway_pids, f"sent by pid {senders[0]}, not the gateway's"
    [prefilled] = _seen(prefill)[1:]
    [decoded] = _seen(decode)[1:]
    assert prefilled["kv_transfer_params"]["do_remote_decode"] is True
    assert decoded["kv_transfer_params"]["remote_engine_id"] == "engine-prefill"
    # The launchers' side ports serve their probes and nothing of the engine's API.
    for pod in (prefill, decode):
        assert status(f"{pod.side}/v1/models") == 404


def test_a_decode_pods_pre_stop_lets_a_pd_stream_finish(launchers: Launchers, gateway: Any) -> None:
    prefill, decode = _pod(launchers, "prefill"), _pod(launchers, "decode")
    prefill.wait_ready()
    decode.wait_ready()
    url, _ = gateway(prefill, decode)
    answers: list[httpx.Response] = []
    streaming = threading.Thread(target=lambda: answers.append(_pd_stream(url, 40)))
    streaming.start()  # 40 tokens at 50 ms: ~2 s
    wait_for(lambda: len(_seen(decode)) == 2 or None, 10, "the decode step to begin")

    drained = decode.pre_stop()
    answered = time.monotonic()

    assert (drained.status_code, drained.json()["inFlight"]) == (200, 0)
    assert decode.ready() == 503
    finished_at = _seen(decode)[1]["finished_at"]
    assert finished_at is not None
    assert finished_at <= answered
    streaming.join(timeout=10)
    [response] = answers
    assert response.status_code == 200
    assert response.text.count('"content"') == 40
    assert response.text.endswith("data: [DONE]\n\n")
