"""The gateway's own HTTP/1.1 client to the engines: asyncio protocols and httptools' parser.

Why not aiohttp: under load aiohttp's client was the largest share of the gateway's CPU (27% of
samples at 1,500 requests/s, more than all of llmfleet's own code): per request it builds a
request object, merges header multidicts, runs tracing and cookie hooks and a stream reader.
An engine needs none of that: one POST with three headers, a status, a content type and bytes
(or, for the scraper, a GET of /metrics with a Host header; httpx spent 19-35x the CPU per
scrape: bench/scrape_cost.py).

What it does:
- one pool of idle keep-alive connections per engine (host, port), each kept for
  `keepalive_seconds` (idle ones are swept every half of it, for every engine); a connection
  carries one request at a time; an idle connection the engine closed is never reused, and a
  reused one that dies before any byte of the answer is retried once on a new connection (the
  engine closed it while the request was on its way: uvicorn-based engines close idle
  connections after 5 s);
- the request is written as prebuilt bytes (request line, Host, Content-Type, X-Request-Id,
  Content-Length) plus the body, in one `writelines`;
- the answer's body is handed over as the bytes arrive (httptools undoes chunked encoding);
  past `_HIGH_WATER` unread bytes the socket stops being read until the reader takes them, so
  a slow client cannot make the gateway buffer a whole stream; the reader takes everything that
  arrived at once (a stream is relayed per socket read, not per HTTP chunk);
- one timer per request enforces the read timeout (no bytes for `read_timeout` seconds: headers
  or the next chunk), re-armed lazily rather than per chunk;
- closing an answer that was not read to the end closes its connection, so the engine sees
  the client go.
Failures are `upstream.UpstreamError`s, as for every client of `upstream.Upstream`.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Sequence
from urllib.parse import urlsplit

import httptools

from llmfleet.core.loopback import LoopbackGuard, NonLocalRefused
from llmfleet.gateway.upstream import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamRefusedNonLocal,
    UpstreamTimeout,
)

_HIGH_WATER = 256 * 1024
"""Unread answer bytes past which the engine's socket is no longer read."""
_TARGETS = 32_768
"""Parsed engine URLs kept: more than a fleet's engines (10,000 at 1,000 services x 10), or
each request past the cap would parse and check its URL again (4,096 did at that size)."""


_Target = tuple[str, int, bytes, bytes]
"""An engine URL parsed once (`_target_of`): host and port to connect to, a POST head's fixed
part, a GET's head. A plain tuple of strings and numbers, which the garbage collector stops
tracking: the client keeps one per engine URL for good (20,000 at 10,000 engines), and as
objects of a class they were walked by every full collection (`gc_pauses.py`)."""


def _target_of(url: str) -> _Target:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise UpstreamConnectError(f"only http:// engine URLs are supported: {url}")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        "Content-Type: application/json\r\nX-Request-Id: "
    ).encode("latin-1")
    get_head = f"GET {path} HTTP/1.1\r\nHost: {parts.netloc}\r\n\r\n".encode("latin-1")
    return (parts.hostname, parts.port or 80, head, get_head)


class _Connection(asyncio.Protocol):
    """One connection to an engine, carrying one exchange (`_Answer`) at a time."""

    def __init__(self, pool: WireUpstream) -> None:
        self._pool = pool
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.answer: _Answer | None = None
        self._parser: httptools.HttpResponseParser | None = None
        """The answer's parser, made per exchange (`begin`): an idle kept connection holds none,
        so it is ~10 objects fewer for the garbage collector to walk (the parser and its
        callbacks, bound methods of this connection), thousands at fleet scale (`gc_pauses.py`)."""
        self._reading = True

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.answer is None or self._parser is None:  # bytes nobody asked for: the
            self.close()  # connection cannot be trusted
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as error:
            self.answer.fail(UpstreamError(f"malformed HTTP answer from the engine: {error}"))
            self.close()

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._pool.forget(self)
        answer, self.answer = self.answer, None
        if answer is not None:
            answer.connection_lost(exc)
        # No cycle outlives the connection (the parser calls back into it, the answer points
        # back at it): a closed connection is freed by reference counting, also when the
        # gateway's heap was frozen while it was open (`gc_pauses.py`).
        self._parser = None
        self.transport = None

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        if self.answer is not None:
            self.answer.header(name, value)

    def on_headers_complete(self) -> None:
        parser = self._parser
        if self.answer is not None and parser is not None:
            self.answer.headers_complete(parser.get_status_code(), parser.should_keep_alive())

    def on_body(self, body: bytes) -> None:
        if self.answer is not None:
            self.answer.feed(body)

    def on_message_complete(self) -> None:
        if self.answer is not None:
            self.answer.complete()

    # flow control and life cycle
    def pause(self) -> None:
        if self._reading and self.transport is not None:
            self._reading = False
            self.transport.pause_reading()

    def resume(self) -> None:
        if not self._reading and self.transport is not None and not self.closed:
            self._reading = True
            self.transport.resume_reading()

    def begin(self, answer: _Answer) -> None:
        """Carry `answer` next, read by a parser of its own."""
        self.answer = answer
        if not self.closed:
            self._parser = httptools.HttpResponseParser(self)

    def reset_for_reuse(self) -> None:
        self.answer = None
        self._parser = None
        self.resume()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class _Answer:
    """An engine's answer on one connection: its head once complete, then its body's bytes."""

    def __init__(
        self, pool: WireUpstream, key: tuple[str, int], connection: _Connection, timeout: float
    ) -> None:
        loop = pool.loop
        self._pool = pool
        self._key = key
        self._connection = connection
        self._loop = loop
        self.status_code = 0
        self.content_type = "application/json"
        self.keep_alive = False
        self.head: asyncio.Future[None] = loop.create_future()
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._waiter: asyncio.Future[None] | None = None
        self._done = False
        self._error: UpstreamError | None = None
        self.started = False
        """Some byte of the answer arrived (a reused connection that dies before is retried)."""
        self._eof_delimited = True  # until a Content-Length or chunked encoding says otherwise
        self._timeout = timeout
        self._last = loop.time()
        self._timer: asyncio.TimerHandle | None = loop.call_at(self._last + timeout, self._check)

    # fed by the connection
    def header(self, name: bytes, value: bytes) -> None:
        self.started = True
        lower = name.lower()
        if lower == b"content-type":
            self.content_type = value.decode("latin-1")
        elif lower == b"content-length" or (
            lower == b"transfer-encoding" and b"chunked" in value.lower()
        ):
            self._eof_delimited = False

    def headers_complete(self, status: int, keep_alive: bool) -> None:
        self.started = True
        self.status_code = status
        self.keep_alive = keep_alive
        self._last = self._loop.time()
        if not self.head.done():
            self.head.set_result(None)

    def feed(self, data: bytes) -> None:
        self._last = self._loop.time()
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > _HIGH_WATER:
            self._connection.pause()
        self._wake()

    def complete(self) -> None:
        self._done = True
        self._stop_timer()
        self._wake()

    def fail(self, error: UpstreamError) -> None:
        if self._done or self._error is not None:
            return
        self._error = error
        self._stop_timer()
        if not self.head.done():
            self.head.set_exception(error)
            self.head.exception()  # retrieved: a caller that left never awaits it
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._done:
            return
        if self.head.done() and self._eof_delimited and exc is None:
            self.complete()  # the body ran to the end of the connection
            return
        where = "mid-answer" if self.head.done() else "before answering"
        self.fail(UpstreamError(f"the engine closed the connection {where}: {exc or 'EOF'}"))

    # timers
    def _check(self) -> None:
        self._timer = None
        if self._done or self._error is not None:
            return
        idle = self._loop.time() - self._last
        if idle < self._timeout:
            self._timer = self._loop.call_at(self._last + self._timeout, self._check)
            return
        self.fail(UpstreamTimeout(f"no bytes from the engine for {self._timeout:g}s"))
        self._connection.close()

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # read by the gateway
    async def _next(self) -> bytes | None:
        while not self._chunks:
            if self._error is not None:
                raise self._error
            if self._done:
                return None
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        # Everything that arrived, in one piece (as aiohttp's `iter_any`): a stream's events
        # are relayed per socket read, not per HTTP chunk.
        chunks = self._chunks
        chunk = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        self._connection.resume()
        return chunk

    async def aread(self) -> bytes:
        parts = []
        while (chunk := await self._next()) is not None:
            parts.append(chunk)
        return b"".join(parts)

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        while (chunk := await self._next()) is not None:
            yield chunk

    async def aclose(self) -> None:
        self._stop_timer()
        connection = self._connection
        if self._done and self.keep_alive and not connection.closed:
            connection.reset_for_reuse()
            self._pool.release(self._key, connection)
        else:  # unread, broken or not kept alive: the engine sees the client go
            connection.close()
        if self._error is None and not self._done:
            self._error = UpstreamError("closed")


class _StaleConnection(Exception):
    """A reused idle connection failed before any byte of the answer."""


class WireUpstream:
    """`upstream.Upstream` over `_Connection`s; opened lazily inside the running loop. `name`
    is the client's in the loopback guard's refusals (the scraper has its own pool)."""

    def __init__(
        self,
        guard: LoopbackGuard,
        *,
        connect_timeout: float,
        keepalive_seconds: float = 30.0,
        name: str = "upstream",
    ) -> None:
        self._guard = guard
        self._name = name
        self._connect_timeout = connect_timeout
        self._keepalive = keepalive_seconds
        self._targets: dict[str, _Target] = {}
        self._idle: dict[tuple[str, int], collections.deque[tuple[float, _Connection]]] = {}
        self._released: collections.deque[tuple[float, tuple[str, int]]] = collections.deque()
        """Every release's time and engine, oldest first: what `_sweep` looks at."""
        self._open: set[_Connection] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def _target(self, url: str) -> _Target:
        target = self._targets.get(url)
        if target is None:
            try:
                self._guard.check_url(url, self._name)
            except NonLocalRefused as error:
                raise UpstreamRefusedNonLocal(str(error)) from None
            target = _target_of(url)
            if len(self._targets) >= _TARGETS:  # endpoints come and go: start over, not grow
                self._targets.clear()
            self._targets[url] = target
        return target

    def _reusable(self, key: tuple[str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        now = self.loop.time()
        while idle:
            since, connection = idle.pop()
            if not connection.closed and now - since < self._keepalive:
                return connection
            connection.close()
            self._open.discard(connection)
        return None

    async def _connect(self, target: _Target) -> _Connection:
        loop = self.loop
        host, port = target[0], target[1]
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(self), host, port),
                self._connect_timeout,
            )
        except TimeoutError:
            raise UpstreamConnectError(
                f"connect to {host}:{port} timed out ({self._connect_timeout:g}s)"
            ) from None
        except OSError as error:
            raise UpstreamConnectError(f"connect to {host}:{port}: {error}") from None
        self._open.add(connection)
        return connection

    def release(self, key: tuple[str, int], connection: _Connection) -> None:
        """Keep `connection` for the next request to `key` (most recent first); the oldest
        idle ones, closed by the engine or past `keepalive_seconds`, are dropped on the way."""
        idle = self._idle.setdefault(key, collections.deque())
        now = self.loop.time()
        self._expire(idle, now)
        idle.append((now, connection))
        self._released.append((now, key))
        self._sweep(now)

    def _expire(self, idle: collections.deque[tuple[float, _Connection]], now: float) -> None:
        while idle and (idle[0][1].closed or now - idle[0][0] >= self._keepalive):
            connection = idle.popleft()[1]
            connection.close()
            self._open.discard(connection)

    def _sweep(self, now: float) -> None:
        """Close the idle connections past `keepalive_seconds` of every engine, not only of
        those asked again: with thousands of engines each asked once in a while (the scraper
        over an idle fleet), a connection per engine would otherwise stay open for good.
        Done on every release, for the engines whose releases have aged past the keep-alive
        (`_released`, oldest first): its cost is what expired, not the engines known. A sweep
        of every engine every half keep-alive was a 3-4 ms step of the event loop every 1.5 s
        at 10,000 engines (the scraper's keep-alive is 3 s), and its closes came in a burst."""
        released = self._released
        while released and now - released[0][0] >= self._keepalive:
            key = released.popleft()[1]
            idle = self._idle.get(key)
            if idle is not None:
                self._expire(idle, now)
                if not idle:
                    del self._idle[key]

    def forget(self, connection: _Connection) -> None:
        self._open.discard(connection)

    async def send(
        self, url: str, body: bytes, headers: Sequence[tuple[str, str]], read_timeout: float
    ) -> _Answer:
        target = self._target(url)
        request_id = next((v for k, v in headers if k.lower() == "x-request-id"), "")
        head = b"%s%s\r\nContent-Length: %d\r\n\r\n" % (
            target[2],
            request_id.encode("latin-1"),
            len(body),
        )
        return await self._request(target, head, body, read_timeout)

    async def get(self, url: str, read_timeout: float) -> _Answer:
        target = self._target(url)
        return await self._request(target, target[3], b"", read_timeout)

    async def _request(
        self, target: _Target, head: bytes, body: bytes, read_timeout: float
    ) -> _Answer:
        """Send on an idle connection to the engine if there is one (once more on a new one if
        the engine had closed it), else on a new one."""
        key = (target[0], target[1])
        reused = self._reusable(key)
        if reused is not None:
            try:
                return await self._exchange(reused, key, head, body, read_timeout, reused=True)
            except _StaleConnection:
                pass  # the engine closed the idle connection as we reused it: a new one
        connection = await self._connect(target)
        return await self._exchange(connection, key, head, body, read_timeout, reused=False)

    async def _exchange(  # noqa: PLR0917 - one request's parts
        self,
        connection: _Connection,
        key: tuple[str, int],
        head: bytes,
        body: bytes,
        read_timeout: float,
        reused: bool,
    ) -> _Answer:
        """Write the request on `connection`; the answer once its head arrived."""
        answer = _Answer(self, key, connection, read_timeout)
        connection.begin(answer)
        if connection.transport is None or connection.closed:
            answer.fail(UpstreamError("the connection closed before the request was sent"))
        else:
            connection.transport.writelines((head, body))
        try:
            await answer.head
        except UpstreamTimeout:
            raise
        except UpstreamError:
            if reused and not answer.started:
                raise _StaleConnection from None
            raise
        except BaseException:  # cancelled (the client left): the engine must see it
            await answer.aclose()
            raise
        return answer

    async def aclose(self) -> None:
        for connection in self._open:
            connection.close()
        self._open.clear()
        self._idle.clear()
        self._released.clear()
