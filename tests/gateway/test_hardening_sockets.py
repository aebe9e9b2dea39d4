"""Hardening over real sockets, where the server's own reading matters: the body limit, oversized
and non-ASCII headers, and slow clients (header and body read timeouts).

The limit tests serve the app with uvicorn in a thread (`ThreadServer`); the header and timeout
tests run `llmfleet gateway` itself, since those limits live in the server the CLI starts. Each
test ends by checking that the gateway still serves a normal request.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from llmfleet.gateway.discovery import Pool, Service, StaticDiscovery
from tests.gateway.servers import ThreadServer, free_port, gateway, status, wait_for
from tests.gateway.standin import StandIn

MODEL = "m"
CHAT = "/v1/chat/completions"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
DEFAULT_BODY_LIMIT = 8 * 1024 * 1024
READ_TIMEOUT = 1.0
"""The CLI gateway's header and body read timeouts (LLMFLEET_GATEWAY_*_READ_TIMEOUT_SECONDS)."""
SLACK = 4.0
"""How much later than its timeout the server may close a slow connection."""
LLMFLEET = Path(sys.executable).parent / "llmfleet"


@dataclass
class Answer:
    """What a server sent on a raw connection before closing it (or before the deadline)."""

    data: bytes
    closed: bool

    @property
    def status(self) -> int | None:
        """The status of the first response, None if no status line arrived."""
        if not self.data.startswith(b"HTTP/1.1 "):
            return None
        return int(self.data.split(b" ", 2)[1])


def _exchange(port: int, request: bytes, deadline: float, *, until_closed: bool) -> Answer:
    """Send `request` on a new connection and read until the server closes it (`until_closed`)
    or a response head arrived, for at most `deadline` seconds. A connection reset, while
    sending or reading, counts as closed."""
    data = b""
    end = time.monotonic() + deadline
    with socket.create_connection(("127.0.0.1", port), timeout=deadline) as sock:
        try:
            sock.sendall(request)
        except (BrokenPipeError, ConnectionResetError):
            return Answer(data, closed=True)
        while (left := end - time.monotonic()) > 0:
            sock.settimeout(left)
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            except ConnectionResetError:
                return Answer(data, closed=True)
            if not chunk:
                return Answer(data, closed=True)
            data += chunk
            if not until_closed and b"\r\n\r\n" in data:
                break
    return Answer(data, closed=False)


def _head(path: str, headers: dict[str, str | bytes]) -> bytes:
    lines = [f"POST {path} HTTP/1.1".encode(), b"Host: 127.0.0.1"]
    for name, value in headers.items():
        lines.append(
            name.encode() + b": " + (value if isinstance(value, bytes) else value.encode())
        )
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _json(value: object) -> bytes:
    return json.dumps(value).encode()


def _serves_a_normal_request(url: str) -> None:
    response = httpx.post(f"{url}{CHAT}", json=BODY, timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers.get("x-request-id")


def _assert_too_large(response: httpx.Response) -> None:
    assert response.status_code == 413, f"{response.status_code}: {response.text[:300]}"
    assert response.headers.get("x-request-id")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "body_too_large"


def _one_pool(url: str) -> StaticDiscovery:
    return StaticDiscovery(
        {MODEL: Service(MODEL, "ns", "svc", {"unified": Pool("unified", (url,))})}
    )


@pytest.fixture(scope="module")
def engine() -> Iterator[tuple[StandIn, str]]:
    stand_in = StandIn("e")
    with ThreadServer(stand_in.app()) as server:
        yield stand_in, server.url


@pytest.fixture
def served(engine: tuple[StandIn, str]) -> Iterator[tuple[StandIn, ThreadServer]]:
    """The app under uvicorn in a thread, default settings, in front of the stand-in."""
    stand_in, url = engine
    stand_in.received.clear()
    with gateway(_one_pool(url)) as server:
        yield stand_in, server


def test_a_10_mb_body_over_a_socket_is_a_413(served: tuple[StandIn, ThreadServer]) -> None:
    stand_in, server = served
    content = "a" * 10_000_000
    body = {**BODY, "messages": [{"role": "user", "content": content}]}
    _assert_too_large(httpx.post(f"{server.url}{CHAT}", json=body, timeout=30))
    assert stand_in.received == []
    _serves_a_normal_request(server.url)


def test_a_7_mib_body_under_the_default_limit_is_forwarded(
    served: tuple[StandIn, ThreadServer],
) -> None:
    """The default limit is big enough for the largest context, and the upstream client sends
    a body that size without a warning (aiohttp warns about raw bytes over 1 MiB)."""
    stand_in, server = served
    content = "a" * (7 * 1024 * 1024)
    body = {**BODY, "messages": [{"role": "user", "content": content}]}
    response = httpx.post(f"{server.url}{CHAT}", json=body, timeout=30)
    assert response.status_code == 200, response.text[:300]
    assert len(stand_in.received) == 1


def test_a_declared_length_beyond_the_limit_is_refused_before_the_body_is_read(
    served: tuple[StandIn, ThreadServer],
) -> None:
    """Only the head is sent: a gateway that waited for the 10 MB would never answer."""
    _, server = served
    head = _head(CHAT, {"Content-Type": "application/json", "Content-Length": "10000000"})
    answer = _exchange(server.port, head, 10, until_closed=False)
    assert answer.status == 413, answer
    _serves_a_normal_request(server.url)


def test_a_chunked_body_beyond_the_limit_is_a_413(served: tuple[StandIn, ThreadServer]) -> None:
    """No Content-Length: the limit holds for what is read."""
    stand_in, server = served
    piece = b"a" * 1024 * 1024

    def chunks() -> Iterator[bytes]:
        yield b'{"model":"m","messages":[{"role":"user","content":"'
        for _ in range(DEFAULT_BODY_LIMIT // len(piece) + 1):
            yield piece
        yield b'"}]}'

    try:
        response = httpx.post(f"{server.url}{CHAT}", content=chunks(), timeout=30)
    except httpx.WriteError:  # answered and closed while the rest was being sent: allowed
        pass
    else:
        _assert_too_large(response)
    assert stand_in.received == []
    _serves_a_normal_request(server.url)


@dataclass
class CliGateway:
    port: int
    url: str
    log: Path


@contextlib.contextmanager
def _cli_gateway(engine_url: str, folder: Path, **settings: str) -> Iterator[CliGateway]:
    """`llmfleet gateway` in front of `engine_url` with `settings` (LLMFLEET_GATEWAY_* names
    without the prefix); its log in a file."""
    config = folder / "fleet.yaml"
    config.write_text(f"models:\n  {MODEL}:\n    unified: [{engine_url}]\n")
    log = folder / "gateway.log"
    port = free_port()
    env = {**os.environ, **{f"LLMFLEET_GATEWAY_{name}": value for name, value in settings.items()}}
    command = [str(LLMFLEET), "gateway", "--static-config", str(config), "--port", str(port)]
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: status(f"{url}/readyz") == 200 or None, 20, "the gateway")
        yield CliGateway(port, url, log)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=10)


@pytest.fixture(scope="module")
def cli_gateway(
    engine: tuple[StandIn, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CliGateway]:
    """`llmfleet gateway` with 1 s header and body read timeouts."""
    _, engine_url = engine
    with _cli_gateway(
        engine_url,
        tmp_path_factory.mktemp("cli-gateway"),
        HEADER_READ_TIMEOUT_SECONDS=str(READ_TIMEOUT),
        BODY_READ_TIMEOUT_SECONDS=str(READ_TIMEOUT),
    ) as started:
        yield started


@pytest.fixture
def cli(cli_gateway: CliGateway) -> Iterator[CliGateway]:
    """The CLI gateway; after the test it still serves, and it logged no traceback meanwhile."""
    logged_before = cli_gateway.log.stat().st_size
    yield cli_gateway
    _serves_a_normal_request(cli_gateway.url)
    with cli_gateway.log.open("rb") as log:
        log.seek(logged_before)
        assert b"Traceback" not in log.read()


def test_a_64_kb_header_is_a_4xx_or_a_closed_connection(cli: CliGateway) -> None:
    body = _json(BODY)
    head = _head(
        CHAT,
        {"Content-Type": "application/json", "Content-Length": str(len(body)),
         "X-Padding": "a" * 65536},
    )  # fmt: skip
    answer = _exchange(cli.port, head + body, 10, until_closed=True)
    assert answer.status == 431, answer.data[:300]
    assert answer.closed
    error = json.loads(answer.data.split(b"\r\n\r\n", 1)[1])["error"]
    assert error["code"] == "headers_too_large"


@pytest.mark.parametrize(
    "request_id",
    [
        pytest.param("é".encode("latin-1"), id="latin-1-byte"),
        pytest.param("é".encode(), id="utf-8-e-acute"),
    ],
)
def test_a_non_ascii_request_id_on_the_wire_is_not_a_5xx(
    cli: CliGateway, request_id: bytes
) -> None:
    body = _json(BODY)
    head = _head(
        CHAT,
        {"Content-Type": "application/json", "Content-Length": str(len(body)),
         "X-Request-Id": request_id, "Connection": "close"},
    )  # fmt: skip
    answer = _exchange(cli.port, head + body, 10, until_closed=True)
    assert answer.status is not None, answer
    assert answer.status < 500, answer.data[:300]
    headers = answer.data.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]
    echoed = [line.split(b":", 1)[1].strip() for line in headers
              if line.lower().startswith(b"x-request-id:")]  # fmt: skip
    assert len(echoed) == 1, headers
    assert echoed[0].isascii(), echoed


def test_a_client_that_stops_sending_headers_is_closed_after_the_header_timeout(
    cli: CliGateway,
) -> None:
    partial = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: app"
    answer = _exchange(cli.port, partial, READ_TIMEOUT + SLACK, until_closed=True)
    assert answer.status == 408, f"no 408 {READ_TIMEOUT + SLACK}s after the last byte: {answer}"
    assert answer.closed


def test_a_body_that_stops_mid_way_is_a_408_or_closed_after_the_body_timeout(
    cli: CliGateway,
) -> None:
    head = _head(CHAT, {"Content-Type": "application/json", "Content-Length": "1000"})
    answer = _exchange(cli.port, head + b'{"model":', READ_TIMEOUT + SLACK, until_closed=False)
    assert answer.status == 408 or (answer.status is None and answer.closed), (
        f"neither a 408 nor a close {READ_TIMEOUT + SLACK}s after the last body byte: {answer}"
    )


def test_slow_connections_do_not_hold_up_other_clients(cli: CliGateway) -> None:
    """Twenty connections stuck in their headers; a normal request is served meanwhile."""
    partial = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    with contextlib.ExitStack() as stack:
        for _ in range(20):
            sock = stack.enter_context(socket.create_connection(("127.0.0.1", cli.port)))
            sock.sendall(partial)
        _serves_a_normal_request(cli.url)


def test_connections_beyond_the_limit_are_answered_503(
    engine: tuple[StandIn, str], tmp_path: Path
) -> None:
    """With MAX_CONNECTIONS 3, three idle keep-alive connections fill it: a fourth connection's
    request is refused with 503 in OpenAI's shape until the others close."""
    _, engine_url = engine
    with _cli_gateway(engine_url, tmp_path, MAX_CONNECTIONS="3") as cli:
        body = _json(BODY)
        request = (
            _head(CHAT, {"Content-Type": "application/json", "Content-Length": str(len(body))})
            + body
        )
        with contextlib.ExitStack() as stack:
            for _ in range(3):
                sock = stack.enter_context(socket.create_connection(("127.0.0.1", cli.port)))
                sock.settimeout(10)
                sock.sendall(request)  # served, and the connection kept open (keep-alive)
                assert sock.recv(65536).startswith(b"HTTP/1.1 200"), "an idle slot was refused"
            once = request.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n", 1)
            refused = _exchange(cli.port, once, 10, until_closed=True)
        assert refused.status == 503, refused.data[:300]
        error = json.loads(refused.data.split(b"\r\n\r\n", 1)[1])["error"]
        assert error["code"] == "too_many_connections"
        _serves_a_normal_request(cli.url)  # the idle ones closed: room again
