"""A stream the gateway's shutdown cuts ends cleanly (issue 27): once SIGTERM's
`shutdownTimeoutSeconds` is all but spent, every stream still running gets one OpenAI-shaped SSE
error event (`gateway_shutdown`, the same shape as an engine failing mid-stream) and its engine
sees the client leave, instead of a body truncated mid-event. A real `llmfleet gateway` process,
stopped as Kubernetes stops it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path

import httpx
import pytest

from tests.gateway.servers import ThreadServer
from tests.gateway.standin import StandIn
from tests.net import free_port, status, wait_for

LLMFLEET = Path(sys.executable).parent / "llmfleet"
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def _ready(url: str) -> bool | None:
    return status(f"{url}/readyz") == 200 or None


@pytest.mark.parametrize("upstream", ["wire", "aiohttp", "httpx"])
def test_a_stream_running_at_the_shutdown_timeout_ends_with_an_error_event(
    tmp_path: Path, upstream: str
) -> None:
    engine = StandIn("engine", chunk_interval=0.3, chunks=200)  # a minute of tokens
    with ThreadServer(engine.app()) as server:
        config = tmp_path / "fleet.yaml"
        config.write_text(f"models:\n  m: {{unified: [{server.url}]}}\n")
        port = free_port()
        settings = {"STATIC_CONFIG": str(config), "PORT": str(port),
                    "SHUTDOWN_TIMEOUT_SECONDS": "2", "UPSTREAM_CLIENT": upstream}  # fmt: skip
        environment = os.environ | {f"LLMFLEET_GATEWAY_{k}": v for k, v in settings.items()}
        log = tmp_path / "gateway.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [str(LLMFLEET), "gateway"], env=environment, stdout=out, stderr=subprocess.STDOUT
            )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_for(partial(_ready, url), 20, url)
            # The read timeout is the no-hang guard: a stream that is neither ended nor cut
            # fails the test with ReadTimeout.
            with httpx.stream("POST", f"{url}/v1/chat/completions", json=BODY,
                              timeout=20) as response:  # fmt: skip
                assert response.status_code == 200
                lines = response.iter_lines()
                assert next(lines).startswith("data: ")
                process.send_signal(signal.SIGTERM)
                rest = [line for line in lines if line]
            process.wait(timeout=20)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            print(log.read_text())
        assert engine.client_left.wait(10), "the engine's stream was not closed"
    assert rest, "the stream ended without a word"
    assert all(line.startswith("data: ") for line in rest), rest
    last = json.loads(rest[-1].removeprefix("data: "))
    assert last["error"]["code"] == "gateway_shutdown"
    assert "shutting down" in last["error"]["message"]
    assert not any("[DONE]" in line for line in rest)
    # Tokens kept coming until the cut: the stream was not cut at SIGTERM itself.
    assert len(rest) > 2
    assert process.returncode in (0, -signal.SIGTERM)
