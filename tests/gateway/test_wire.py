"""The gateway's HTTP/1.1 client (`wire.py`) against raw asyncio servers on 127.0.0.1 that
misbehave on purpose: connections closed as they are reused, bodies delimited by the end of the
connection, stalls, answers nobody reads, bodies bigger than the read-ahead."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from llmfleet.core.loopback import LoopbackGuard
from llmfleet.gateway.upstream import UpstreamConnectError, UpstreamResponse, UpstreamTimeout
from llmfleet.gateway.wire import _HIGH_WATER, WireUpstream

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]
HEADERS = (("Content-Type", "application/json"), ("X-Request-Id", "r1"))
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


async def _request(reader: asyncio.StreamReader) -> bytes:
    """One request (head and Content-Length body) off `reader`; b"" when the client closed."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return head + await reader.readexactly(length)


@contextlib.asynccontextmanager
async def _server(handler: Handler) -> AsyncIterator[tuple[str, list[int]]]:
    """A server running `handler(reader, writer, n)` for its n-th connection; yields its URL
    and the list of connection numbers seen."""
    seen: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(len(seen))
        try:
            await handler(reader, writer, seen[-1])
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1/chat/completions", seen
    finally:
        server.close()


async def _read_all(answer: UpstreamResponse) -> list[bytes]:
    return [chunk async for chunk in answer.aiter_raw()]


def _client() -> WireUpstream:
    return WireUpstream(LoopbackGuard(True), connect_timeout=2)


def test_a_kept_alive_connection_is_reused() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        while await _request(reader):
            writer.write(OK)

    async def run() -> list[int]:
        client = _client()
        async with _server(handler) as (url, seen):
            for _ in range(3):
                answer = await client.send(url, b"{}", HEADERS, 5)
                assert await answer.aread() == b"{}"
                await answer.aclose()
            await client.aclose()
            return seen

    assert asyncio.run(run()) == [0]


def test_an_idle_connection_closed_as_it_is_reused_is_retried_once_on_a_new_one() -> None:
    """The engine reads the second request on the old connection and closes it unanswered
    (its idle timeout raced the request): the client sends it again on a new connection."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await _request(reader)
        writer.write(OK)
        if n == 0:
            await _request(reader)  # the reused connection's request: dropped, unanswered
            return
        while await _request(reader):
            writer.write(OK)

    async def run() -> list[int]:
        client = _client()
        async with _server(handler) as (url, seen):
            for _ in range(2):
                answer = await client.send(url, b"{}", HEADERS, 5)
                assert answer.status_code == 200
                assert await answer.aread() == b"{}"
                await answer.aclose()
            await client.aclose()
            return seen

    assert asyncio.run(run()) == [0, 1]


def test_a_body_delimited_by_the_end_of_the_connection_is_read_whole() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await _request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nwhole body")
        await writer.drain()

    async def run() -> bytes:
        client = _client()
        async with _server(handler) as (url, _):
            answer = await client.send(url, b"{}", HEADERS, 5)
            body = await answer.aread()
            await answer.aclose()
            await client.aclose()
            return body

    assert asyncio.run(run()) == b"whole body"


@pytest.mark.parametrize("stall", ["before-the-head", "mid-body"])
def test_an_engine_that_stalls_times_out(stall: str) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await _request(reader)
        if stall == "mid-body":
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await asyncio.sleep(30)

    async def run() -> None:
        client = _client()
        async with _server(handler) as (url, _):
            try:
                with pytest.raises(UpstreamTimeout):
                    await _read_all(await client.send(url, b"{}", HEADERS, 0.3))
            finally:
                await client.aclose()

    asyncio.run(asyncio.wait_for(run(), 10))


def test_an_answer_closed_unread_closes_its_connection_and_the_engine_sees_it() -> None:
    engine_saw_close = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await _request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        if await reader.read(1) == b"":
            engine_saw_close.set()

    async def run() -> bool:
        client = _client()
        async with _server(handler) as (url, _):
            answer = await client.send(url, b"{}", HEADERS, 5)
            await answer.aclose()
            seen = await asyncio.wait_for(engine_saw_close.wait(), 5)
            await client.aclose()
            return seen

    assert asyncio.run(run())


def test_a_big_answer_nobody_reads_stops_being_read_from_the_socket() -> None:
    size = 16 * _HIGH_WATER
    sent = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await _request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        writer.write(b"x" * size)
        await writer.drain()  # returns only once the client has taken the bytes
        sent.set()

    async def run() -> tuple[bool, int]:
        client = _client()
        async with _server(handler) as (url, _):
            answer = await client.send(url, b"{}", HEADERS, 5)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(sent.wait(), 1)
            drained_unread = sent.is_set()
            body = await answer.aread()  # reading resumes the socket: all of it arrives
            await answer.aclose()
            await client.aclose()
            return drained_unread, len(body)

    drained_unread, received = asyncio.run(run())
    assert not drained_unread, "the client read the whole answer into memory unasked"
    assert received == size


def test_a_refused_connection_is_a_connect_error() -> None:
    async def run() -> None:
        client = _client()
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        with pytest.raises(UpstreamConnectError):
            await client.send(f"http://127.0.0.1:{port}/v1/completions", b"{}", HEADERS, 5)
        await client.aclose()

    asyncio.run(run())


def test_a_get_sends_no_body_and_reads_a_chunked_answer_on_a_kept_alive_connection() -> None:
    """The scraper's GET of /metrics: request line, Host and nothing else; the answer chunked
    (as uvicorn sends vLLM's exposition); the next GET reuses the connection."""
    heads: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        while head := await reader.readuntil(b"\r\n\r\n"):
            heads.append(head)
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n"
                b"\r\n5\r\nvllm:\r\ne\r\nrunning 3.0\n#\n\r\n0\r\n\r\n"
            )

    async def run() -> list[int]:
        client = _client()
        async with _server(handler) as (url, seen):
            metrics = url.replace("/v1/chat/completions", "/metrics")
            for _ in range(2):
                answer = await client.get(metrics, 5)
                assert (answer.status_code, answer.content_type) == (200, "text/plain")
                assert await answer.aread() == b"vllm:running 3.0\n#\n"
                await answer.aclose()
            await client.aclose()
            return seen

    assert asyncio.run(run()) == [0]
    port = heads[0].split(b"Host: 127.0.0.1:")[1].split(b"\r\n")[0]
    assert heads == [b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:%s\r\n\r\n" % port] * 2


def test_idle_connections_of_engines_not_asked_again_are_closed_after_the_keepalive() -> None:
    """Engines asked once (the scraper over an idle fleet) do not keep a connection each: a
    request to another engine after the keep-alive sweeps theirs, and the engines see them
    close; the engine asked within the keep-alive keeps its connection."""
    closed: list[str] = []

    def serving(name: str) -> Handler:
        async def handler(
            reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int
        ) -> None:
            try:
                while await _request(reader):
                    writer.write(OK)
            finally:  # the client closed the connection (an incomplete read)
                closed.append(name)

        return handler

    async def ask(client: WireUpstream, url: str) -> None:
        answer = await client.send(url, b"{}", HEADERS, 5)
        assert await answer.aread() == b"{}"
        await answer.aclose()

    async def run() -> tuple[list[str], list[int]]:
        client = WireUpstream(LoopbackGuard(True), connect_timeout=2, keepalive_seconds=0.4)
        async with (
            _server(serving("once-a")) as (once_a, _),
            _server(serving("once-b")) as (once_b, _),
            _server(serving("busy")) as (busy, seen),
        ):
            await ask(client, once_a)
            await ask(client, once_b)
            for _ in range(10):  # 1 s: past the keep-alive of the engines asked once
                await ask(client, busy)
                await asyncio.sleep(0.1)
            deadline = asyncio.get_running_loop().time() + 5
            while len(closed) < 2 and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.01)
            found = sorted(closed)
            await client.aclose()
            return found, seen

    found, busy_connections = asyncio.run(run())
    assert found == ["once-a", "once-b"]
    assert busy_connections == [0]  # asked every 0.1 s: one connection, reused throughout


def test_a_connection_the_engine_closed_is_freed_without_the_cycle_collector() -> None:
    """Nothing of a closed connection is left in a reference cycle: once the engine has
    closed it and nothing holds it, reference counting frees it (what the gateway froze while
    it was open is never walked by the collector again: `gc_pauses.Refreezer`)."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await _request(reader)
        writer.write(OK)  # then the handler returns: the server closes the connection

    async def run() -> weakref.ref[object]:
        client = WireUpstream(LoopbackGuard(True), connect_timeout=2, keepalive_seconds=0.05)
        async with _server(handler) as (url, _):
            answer = await client.send(url, b"{}", HEADERS, 5)
            connection = weakref.ref(answer._connection)
            assert await answer.aread() == b"{}"
            await answer.aclose()
            del answer
            deadline = asyncio.get_running_loop().time() + 5
            while not connection().closed and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)  # past the keep-alive: the next release sweeps it
            async with _server(handler) as (other, _):
                answer = await client.send(other, b"{}", HEADERS, 5)
                await answer.aread()
                await answer.aclose()
                del answer
            await client.aclose()
            return connection

    gc.disable()
    try:
        connection = asyncio.run(run())
        assert connection() is None
    finally:
        gc.enable()


def test_an_idle_kept_connection_holds_no_parser_and_targets_are_not_tracked() -> None:
    """What the client keeps between requests is little for the garbage collector to walk
    (`gc_pauses.py`): an idle kept-alive connection has no answer parser (made per exchange,
    its callbacks bound to the connection), and the parsed engine URLs, one per URL for good,
    are plain tuples the collector stops tracking."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        while await _request(reader):
            writer.write(OK)

    async def run() -> None:
        client = _client()
        async with _server(handler) as (url, seen):
            for _ in range(2):
                answer = await client.send(url, b"{}", HEADERS, 5)
                connection = answer._connection
                assert connection._parser is not None  # reading this answer
                assert await answer.aread() == b"{}"
                await answer.aclose()
                assert connection._parser is None
                assert connection.answer is None
            assert seen == [0]  # the same connection, with a parser per exchange
            gc.collect()
            assert client._targets
            assert not any(gc.is_tracked(t) for t in client._targets.values())
            await client.aclose()

    asyncio.run(run())


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def time(self) -> float:
        return self.now


class _Idle:
    """An idle connection as the pool sees it."""

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_a_sweep_looks_at_what_expired_not_at_every_engine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """2,000 engines asked once, then one engine asked every 0.1 s: each release looks at the
    engines whose releases aged past the keep-alive, not at all 2,000 (a walk of every engine
    every half keep-alive was a 3-4 ms step of the loop at 10,000 engines); each of the 2,000
    is closed once its keep-alive has passed, the busy one is kept."""
    client = WireUpstream(LoopbackGuard(True), connect_timeout=2, keepalive_seconds=3)
    clock = _Clock()
    client._loop = clock  # type: ignore[assignment]
    looked: list[tuple[str, int]] = []
    expire = client._expire

    def counting(idle: object, now: float) -> None:
        looked.append(next((k for k, v in client._idle.items() if v is idle), ("?", 0)))
        expire(idle, now)  # type: ignore[arg-type]

    monkeypatch.setattr(client, "_expire", counting)
    once = [_Idle() for _ in range(2000)]
    for index, connection in enumerate(once):
        client.release((f"10.0.{index // 250}.{index % 250}", 8000), connection)  # type: ignore[arg-type]
    busy = _Idle()
    swept_at = []
    for step in range(60):  # 6 s, twice the keep-alive
        clock.now = 0.1 * (step + 1)
        looked.clear()
        client.release(("10.9.9.9", 8000), busy)  # type: ignore[arg-type]
        # its own engine's queue, then those of the releases that aged past the keep-alive:
        # none before 3 s, the 2,000 once, then the busy engine's release of 3 s before
        if len(looked) > 2:
            swept_at.append(round(clock.now, 1))
            assert len(looked) == 2001
        else:
            assert len(looked) == (1 if clock.now < 3 else 2)
        client._idle[("10.9.9.9", 8000)].pop()  # taken again by the next request
    assert swept_at == [3.0]
    assert all(connection.closed for connection in once)
    assert not busy.closed
    assert set(client._idle) == {("10.9.9.9", 8000)}
