"""One coalesced upstream call and every caller it answers (the I/O half of `coalesce`).

Contracts:
- The upstream call runs in a task owned by the flight, never by a caller: callers await its
  head (the response, or the `Failure`) through `asyncio.shield`, so a caller that leaves
  cancels only its own wait. The flight counts its callers (those waiting for the head, then,
  for streams, those reading); the last one leaving before the end cancels the task, which
  closes the upstream response (the engine sees its client go; the Forwarder accounts for it).
- Every caller gets its own response object: the same status, headers and body, its own
  `x-request-id`, and `x-llmfleet-coalesced: true` when it did not start the call. A `Failure`
  reaches every caller as its own copy.
- Streams: the same task, once the head is there, reads the upstream body into `chunks` (never
  waiting on a reader) and wakes the readers. Each caller's body is a `Reader`, a cursor into
  `chunks`: a late joiner first gets the chunks already sent, then the live ones. A reader that
  falls more than `max_lag` chunks behind (counting only chunks that arrived after it joined)
  is dropped with an SSE error event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from starlette.responses import Response, StreamingResponse

from llmfleet.gateway.errors import stream_error_event
from llmfleet.gateway.policies.base import Handler
from llmfleet.gateway.proxy import Call, Failure

log = logging.getLogger("llmfleet.gateway.policies")

COALESCED_HEADER = "x-llmfleet-coalesced"
_DONE = b"data: [DONE]"


class Flight:
    """The upstream call of `leader`, shared by every caller with the same key."""

    def __init__(
        self,
        key: str,
        leader: Call,
        serve: Handler,
        *,
        window: float,
        max_lag: int,
        ended: Callable[[Flight], None],
        dropped: Callable[[Call], None],
    ) -> None:
        self.key = key
        self.leader = leader.request_id
        self.window = window
        """Seconds a good finished answer may still answer identical requests (0: none)."""
        self.max_lag = max_lag
        self.callers = 0
        """Callers waiting for the head or reading the stream."""
        self.chunks: list[bytes] | None = None
        """The stream's chunks so far (None unless the head is a stream)."""
        self.done = False
        """Nothing more will come: the answer is complete, failed, or abandoned."""
        self.complete = False
        """The upstream stream ended by itself (not cut off)."""
        self.head: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        self.head.add_done_callback(_retrieve)
        self._changed = asyncio.Event()
        self._ended = ended
        self._dropped = dropped
        self._finished = False
        self.task = asyncio.create_task(self._run(leader, serve))

    async def answer(self, call: Call, *, coalesced: bool) -> Response:
        """`call`'s own copy of the flight's answer (or of its Failure)."""
        self.callers += 1
        try:
            head = await asyncio.shield(self.head)
        except Failure as failure:
            self.leave()
            raise Failure(_copy(failure.response, call, coalesced), failure.outcome) from None
        except BaseException:  # cancelled (the caller left), or an error every caller gets
            self.leave()
            raise
        if self.chunks is None:
            self.leave()
            return _copy(head, call, coalesced)
        # The reader takes over this caller's place in `callers` until it ends or is dropped.
        return _copy(head, call, coalesced, Reader(self, call, joined=len(self.chunks)))

    def leave(self) -> None:
        self.callers -= 1
        if self.callers == 0 and not self.done:
            log.info("request_id=%s every caller left; upstream cancelled", self.leader)
            self._finish()
            self.task.cancel()

    def reusable(self) -> bool:
        """A good, whole answer: a 2xx body, or a 200 stream that ended with `[DONE]`."""
        if not self.head.done() or self.head.cancelled() or self.head.exception() is not None:
            return False
        status = self.head.result().status_code
        if self.chunks is None:
            return 200 <= status < 300
        return self.complete and status == 200 and _tail(self.chunks).rstrip().endswith(_DONE)

    async def changed(self) -> None:
        """Until the next chunk (or the end)."""
        await self._changed.wait()

    def drop(self, call: Call) -> None:
        self._dropped(call)

    async def _run(self, call: Call, serve: Handler) -> None:
        # Its own closers: the shared stream is closed by this flight, never by the leader's
        # response ending (others may still be reading).
        own = replace(call, closers=[])
        try:
            await self._relay(own, serve)
        finally:
            for close in own.closers:
                with contextlib.suppress(Exception):
                    await close()

    async def _relay(self, call: Call, serve: Handler) -> None:
        try:
            response = await serve(call)
        except asyncio.CancelledError:
            self.head.cancel()
            raise
        except Exception as error:  # a Failure, mostly: every caller gets its copy
            self.head.set_exception(error)
            self._finish()
            return
        if not isinstance(response, StreamingResponse):
            self.head.set_result(response)
            self._finish()
            return
        chunks: list[bytes] = []
        self.chunks = chunks
        self.head.set_result(response)
        # NOTE: no await between the head and the loop: the upstream iterator starts before a
        # cancellation can arrive, so its own cleanup (closing the engine's response) runs.
        iterator = response.body_iterator
        try:
            async for chunk in iterator:
                chunks.append(chunk if isinstance(chunk, bytes) else _as_bytes(chunk))
                self._wake()
            self.complete = True
        except Exception as error:  # the Forwarder ends engine failures itself; this is a bug
            log.exception("request_id=%s coalesced stream failed", self.leader)
            message = f"the shared upstream stream failed ({type(error).__name__})"
            chunks.append(stream_error_event(502, message, "upstream_stream_error"))
        finally:
            close = getattr(iterator, "aclose", None)
            if close is not None:
                await close()
            self._finish()

    def _finish(self) -> None:
        self.done = True
        self._wake()
        if not self._finished:
            self._finished = True
            self._ended(self)

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()


class Reader:
    """One caller's cursor into a flight's stream: the body iterator of its response."""

    def __init__(self, flight: Flight, call: Call, joined: int) -> None:
        self.flight = flight
        self.call = call
        self.cursor = 0
        self.joined = joined
        """Chunks already there when it joined: a late joiner is not behind for those."""
        self.left = False

    def __aiter__(self) -> Reader:
        return self

    async def __anext__(self) -> bytes:
        flight = self.flight
        chunks = flight.chunks
        if self.left or chunks is None:
            raise StopAsyncIteration
        try:
            while self.cursor >= len(chunks) and not flight.done:
                await flight.changed()
        except BaseException:  # cancelled: the client left
            self._leave()
            raise
        if self.cursor >= len(chunks):
            self._leave()
            raise StopAsyncIteration
        if len(chunks) - max(self.cursor, self.joined) > flight.max_lag:
            self._leave()
            flight.drop(self.call)
            message = (
                f"this reader fell more than {flight.max_lag} chunks behind the shared stream "
                "of identical requests and was dropped; retry"
            )
            return stream_error_event(503, message, "slow_reader")
        self.cursor += 1
        return chunks[self.cursor - 1]

    async def aclose(self) -> None:
        self._leave()

    def _leave(self) -> None:
        if not self.left:
            self.left = True
            self.flight.leave()

    def __del__(self) -> None:
        # NOTE: a response never iterated (its client left first), or cancelled inside the
        # server's send (a slow client that went away), never calls the methods above.
        if not self.left:
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                self._leave()


def _copy(head: Response, call: Call, coalesced: bool, reader: Reader | None = None) -> Response:
    copy = Response(head.body, head.status_code) if reader is None else StreamingResponse(reader)
    copy.status_code = head.status_code
    headers = [(k, v) for k, v in head.raw_headers if k != b"x-request-id"]
    headers.append((b"x-request-id", call.request_id.encode("latin-1")))
    if coalesced:
        headers.append((COALESCED_HEADER.encode(), b"true"))
    copy.raw_headers = headers
    return copy


def _tail(chunks: list[bytes], size: int = 64) -> bytes:
    """The last `size` bytes (or fewer) of the stream."""
    tail = b""
    for chunk in reversed(chunks):
        tail = chunk + tail
        if len(tail) >= size:
            break
    return tail


def _as_bytes(chunk: Any) -> bytes:
    return bytes(chunk) if isinstance(chunk, memoryview) else str(chunk).encode()


def _retrieve(head: asyncio.Future[Response]) -> None:
    """Mark a failed head's exception as seen (every caller may have left before it came)."""
    if not head.cancelled():
        head.exception()
