"""Small helpers shared by tests that run real servers on 127.0.0.1."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TypeVar
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from llmfleet.core import netns

T = TypeVar("T")


def require_isolation() -> None:
    """Fail the test (one line, no traceback) unless this process is in a loopback-only network
    namespace: tests that start servers or clusters never run where a packet could leave."""
    problem = netns.isolation_problem()
    if problem is not None:
        pytest.fail(problem, pytrace=False)


def free_port() -> int:
    """A free port on 127.0.0.1 for a server the test starts (only inside the namespace)."""
    require_isolation()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for(check: Callable[[], T | None], timeout: float, what: str, every: float = 0.05) -> T:
    """Poll `check` every `every` seconds until it returns something other than None, or fail
    after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result is not None:
            return result
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return None


def posted_query(handler: BaseHTTPRequestHandler) -> str:
    """The PromQL a stub Prometheus was asked in `POST /api/v1/query`: the form-encoded body's
    `query`; fails the request's test if the URL carries parameters or the body is not a form
    (`llmfleet.core.prometheus_http`)."""
    url = urlsplit(handler.path)
    assert (url.path, url.query) == ("/api/v1/query", ""), handler.path
    assert handler.headers["Content-Type"] == "application/x-www-form-urlencoded"
    body = handler.rfile.read(int(handler.headers["Content-Length"])).decode()
    return parse_qs(body, strict_parsing=True)["query"][0]


@contextlib.contextmanager
def served(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """`handler` served on a free 127.0.0.1 port in a thread while inside; yields its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
