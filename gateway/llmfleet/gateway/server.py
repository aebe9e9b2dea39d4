"""The gateway's HTTP server: uvicorn (uvloop, httptools) with limits uvicorn lacks.

uvicorn gives an idle keep-alive timeout, but nothing bounds how long a client may take to send
its headers or how big they may be: 500 slow connections trickling a header byte every few
seconds hold 500 sockets for ever. `protocol(settings)` subclasses uvicorn's httptools protocol
with:
- a connection limit: a request on a connection beyond `max_connections` open ones is answered
  503 with `Retry-After` (uvicorn's own `limit_concurrency` counts differently and answers in
  plain text);
- a header-read timeout, armed when a connection opens and when a request's first byte arrives,
  cleared when its headers are complete: past it the client gets 408 and the connection closes
  (checked by one sweep per server every half timeout, not a timer per request);
- a limit on the headers' total size: past it, 431 and the connection closes.
Both answers are OpenAI-shaped JSON. The body's own limits (size, read timeout) are the app's
(`app.py`), where the route is known.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import Callable
from typing import Any, Literal

import prometheus_client
import uvicorn
import uvloop
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from llmfleet.gateway.errors import error_body
from llmfleet.gateway.settings import GatewaySettings


def _raw_response(status: int, reason: str, message: str, code: str) -> bytes:
    body = error_body(status, message, code=code)
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


def protocol(settings: GatewaySettings) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with the header limits of `settings`."""
    timeout = settings.header_read_timeout_seconds
    limit = settings.max_header_bytes
    too_slow = _raw_response(
        408, "Request Timeout", f"the request's headers took longer than {timeout:g}s", "timeout"
    )
    most = settings.max_connections
    retry = str(settings.retry_after_seconds).encode()
    busy = error_body(
        503, f"the gateway has {most} connections open; retry later", code="too_many_connections"
    )

    async def refuse(scope: Any, receive: Any, send: Any) -> None:
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(busy)).encode()),
            (b"retry-after", retry),
        ]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": busy})

    too_large = _raw_response(
        431,
        "Request Header Fields Too Large",
        f"the request's headers are larger than {limit} bytes",
        "headers_too_large",
    )

    class GatewayProtocol(HttpToolsProtocol):
        _deadline: float | None = None
        """When this connection's headers must be complete (None: not reading headers)."""
        _header_bytes = 0
        _oversized = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()
            _sweep_later(self.loop, self.connections, timeout)

        def _arm(self) -> None:
            if self._deadline is None:
                self._deadline = self.loop.time() + timeout

        def _disarm(self) -> None:
            self._deadline = None

        def headers_overdue(self, now: float) -> None:
            """Answer 408 and close if the headers are past their deadline."""
            if self._deadline is not None and now >= self._deadline:
                self._deadline = None
                if not self.transport.is_closing():
                    self.transport.write(too_slow)
                    self.transport.close()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._header_bytes = 0
            self._arm()

        def on_header(self, name: bytes, value: bytes) -> None:
            self._header_bytes += len(name) + len(value) + 4
            if self._header_bytes > limit:
                self._oversized = True
                raise ValueError("headers too large")  # the parser stops; see send_400_response
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._disarm()
            if most is None or len(self.connections) <= most:
                super().on_headers_complete()
                return
            app, self.app = self.app, refuse  # uvicorn starts `self.app` for this request
            try:
                super().on_headers_complete()
            finally:
                self.app = app

        def send_400_response(self, msg: str) -> None:
            if not self._oversized:
                super().send_400_response(msg)
                return
            self._disarm()
            if not self.transport.is_closing():
                self.transport.write(too_large)
                self.transport.close()

    return GatewayProtocol


_SWEEPING: set[int] = set()
"""Ids of the connection sets (one per server) a sweep is scheduled for."""


def _sweep_later(loop: asyncio.AbstractEventLoop, connections: set[Any], timeout: float) -> None:
    """Every `timeout`/2 seconds, answer 408 on the connections whose headers are overdue: one
    timer per server instead of one per request (a request's deadline is a float it stores),
    so a slow-header client is closed between `timeout` and 1.5 x `timeout`."""
    key = id(connections)
    if key in _SWEEPING:
        return
    _SWEEPING.add(key)

    def sweep() -> None:
        now = loop.time()
        for connection in list(connections):
            overdue = getattr(connection, "headers_overdue", None)
            if overdue is not None:
                overdue(now)
        if connections:
            loop.call_later(timeout / 2, sweep)
        else:  # no connection left: the next one schedules a sweep again
            _SWEEPING.discard(key)

    loop.call_later(timeout / 2, sweep)


def _config(
    app: Any, settings: GatewaySettings, port: int, lifespan: Literal["auto", "off"]
) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=settings.host,
        port=port,
        loop="uvloop",
        http=protocol(settings),
        timeout_keep_alive=settings.keepalive_timeout_seconds,
        access_log=False,
        proxy_headers=False,  # the gateway reads no client address; its middleware cost 2%
        server_header=False,
        log_level=settings.log_level.lower(),
        lifespan=lifespan,
        timeout_graceful_shutdown=settings.shutdown_timeout_seconds,
    )


CUT_BEFORE_SECONDS = 1.0
"""How long before the shutdown timeout the streams still running are ended with an error event
(`Forwarder.cut_streams`): time to send it before the server closes their connections."""


class _Server(uvicorn.Server):
    """uvicorn's server, which on shutdown also schedules `cut` (the streams' clean end) for
    `CUT_BEFORE_SECONDS` before the graceful-shutdown timeout; none without a timeout."""

    def __init__(self, config: uvicorn.Config, cut: Callable[[], object] | None) -> None:
        super().__init__(config)
        self._cut = cut

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        timeout = self.config.timeout_graceful_shutdown
        if self._cut is not None and timeout is not None:
            delay = max(0.0, timeout - CUT_BEFORE_SECONDS)
            asyncio.get_running_loop().call_later(delay, self._cut)
        await super().shutdown(sockets)


def process_wide(settings: GatewaySettings) -> None:
    """The switches of the gateway's process (its own, so they may be process-wide)."""
    # No `_created` series: in Prometheus's text format each counter and histogram child gets
    # one more gauge series of its creation time that nothing reads (13% of /metrics at
    # 1,000 pools).
    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
    sys.setswitchinterval(settings.gil_switch_interval_seconds)


def serve(app: Any, settings: GatewaySettings) -> None:
    """Run `app` until SIGINT/SIGTERM with the gateway's server settings; with `admin_port`,
    also the app's `operations` (the admin routes) on that port, in the same event loop.

    NOTE: each uvicorn server takes SIGINT/SIGTERM over while it runs and, once shut down,
    restores the handler it found and raises the signal again. The admin server starts second,
    so a signal stops it first, then the API server (which runs the app's lifespan, so
    discovery and the engine clients close last), then reaches the default handler as before.
    """
    process_wide(settings)
    forwarder = getattr(getattr(app, "state", None), "forwarder", None)
    cut = forwarder.cut_streams if forwarder is not None else None
    main = _Server(_config(app, settings, settings.port, "auto"), cut)
    operations = getattr(app, "operations", None)
    if settings.admin_port is None or operations is None:
        main.run()
        return
    admin = uvicorn.Server(_config(operations, settings, settings.admin_port, "off"))

    async def both() -> None:
        await asyncio.gather(main.serve(), admin.serve())

    uvloop.run(both())
