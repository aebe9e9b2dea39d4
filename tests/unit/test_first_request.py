"""`llmfleet up` ends when its printed first request is answered (core/local/first_request.py),
against a real HTTP server on 127.0.0.1 that answers 503 until its engines "start"."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from llmfleet.core.local import first_request
from tests.net import require_isolation


class Gateway(ThreadingHTTPServer):
    def __init__(self, unavailable: int) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.unavailable = unavailable
        self.bodies: list[dict[str, object]] = []

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class Handler(BaseHTTPRequestHandler):
    server: Gateway

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.bodies.append(body)
        served = len(self.server.bodies) > self.server.unavailable
        ok = self.path == "/v1/chat/completions" and served
        payload = b'{"choices": []}' if ok else b'{"error": {"message": "no serving endpoint"}}'
        self.send_response(200 if ok else 503)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def gateway(request: pytest.FixtureRequest) -> Iterator[Gateway]:
    require_isolation()
    server = Gateway(unavailable=request.param)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(("gateway", "said"), [(0, 0), (3, 1)], indirect=["gateway"])
def test_waits_until_the_printed_request_is_answered(gateway: Gateway, said: int) -> None:
    lines: list[str] = []
    first_request.wait_answered(gateway.base, lines.append, timeout=30, every=0.05)
    assert len(gateway.bodies) == gateway.unavailable + 1
    assert all(body["model"] == first_request.MODEL for body in gateway.bodies)
    assert gateway.bodies[-1]["max_tokens"] == 1
    assert len(lines) == said  # one progress line, only when it has to wait


@pytest.mark.parametrize("gateway", [10**6], indirect=True)
def test_gives_up_with_the_last_answer(gateway: Gateway) -> None:
    ticks = iter(range(100))
    with pytest.raises(first_request.NotAnswered, match=r"within 5s .*503 .*no serving endpoint"):
        first_request.wait_answered(
            gateway.base, lambda _: None, timeout=5, clock=lambda: float(next(ticks)),
            sleep=lambda _: None,
        )  # fmt: skip
    assert 5 <= len(gateway.bodies) <= 7


def test_an_unreachable_gateway_is_said() -> None:
    require_isolation()
    ticks = iter(range(100))
    with pytest.raises(first_request.NotAnswered, match="ConnectError"):
        first_request.wait_answered(
            "http://127.0.0.1:9/v1", lambda _: None, timeout=2, clock=lambda: float(next(ticks)),
            sleep=lambda _: None,
        )  # fmt: skip
