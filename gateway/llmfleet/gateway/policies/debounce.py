"""Debouncing (`traffic.debounce`): a newer request of the same session supersedes the older one.

With `mode: LatestWins`, a request that carries a session (`Call.session`: the `x-session-id`
header, else the body's `user`, else the API key) is held `delayMs` before it goes on down the
chain. A newer request of the same tenant, session and service arriving less than `windowMs`
after an older one supersedes it:

- still held: the older one never reaches an engine (`superseded{when="held"}`);
- dispatched, no answer yet: the rest of its chain is cancelled, which closes the upstream
  connection, so the engine sees its client go (`when="dispatched"`);
- either way its caller gets HTTP 409 with `code: "superseded"`; a stream already under way is
  cut instead, its upstream closed, and it ends with an SSE error event of the same shape (no
  `[DONE]`) (`when="dispatched"`).

Only the newest request of a session is kept (`_latest`), and each arrival supersedes the one
before it, so with three requests close together the newest always wins. An entry leaves the
table when its request finishes, or once its window has passed (nothing can supersede it then),
so the table holds at most the requests that arrived within the last window.

Off (the default) or no session: the call passes straight through.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.responses import AsyncContentStream, Content, Response, StreamingResponse

from llmfleet.crds.policy import DebounceMode
from llmfleet.gateway.errors import error_response, stream_error_event
from llmfleet.gateway.policies.base import Handler, PolicyDeps
from llmfleet.gateway.proxy import Call, Failure

log = logging.getLogger("llmfleet.gateway.policies")

_Key = tuple[str, str, str | None, str]
"""namespace, service, tenant, session: a session id never reaches across tenants."""


@dataclass(eq=False, slots=True)
class _Turn:
    """One request's place in its session."""

    key: _Key
    request_id: str
    expires: float
    """Clock reading from which no newer request can supersede this one."""
    superseded: asyncio.Future[str]
    """Done (with the newer request's id) once a newer request superseded this one."""


class Debouncer:
    def __init__(self, deps: PolicyDeps) -> None:
        self.deps = deps
        self._latest: dict[_Key, _Turn] = {}
        self._arrivals: deque[_Turn] = deque()
        """Every turn of the last window, oldest first: what `_prune` drops from `_latest`."""

    async def __call__(self, call: Call, next: Handler) -> Response:
        spec = call.service.traffic.debounce
        if spec.mode is not DebounceMode.LATEST_WINS or call.session is None:
            return await next(call)
        turn = self._enter(call, call.session, spec.window_ms / 1000)
        try:
            if spec.delay_ms:
                await asyncio.wait((turn.superseded,), timeout=spec.delay_ms / 1000)
            if turn.superseded.done():
                raise self._refusal(call, turn, "held")
            response = await self._dispatch(call, next, turn)
        except BaseException:
            self._leave(turn)
            raise
        if isinstance(response, StreamingResponse):
            response.body_iterator = self._watched(call, turn, response.body_iterator)
        else:
            self._leave(turn)
        return response

    def _enter(self, call: Call, session: str, window: float) -> _Turn:
        """Make `call` its session's newest request, superseding the previous one if that
        arrived less than `window` seconds ago and is still in the table (in flight)."""
        now = self.deps.clock()
        self._prune(now)
        key = (call.service.namespace, call.service.name, call.tenant, session)
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        turn = _Turn(key, call.request_id, now + window, future)
        older = self._latest.get(key)
        if older is not None and now < older.expires and not older.superseded.done():
            older.superseded.set_result(call.request_id)
        self._latest[key] = turn
        self._arrivals.append(turn)
        return turn

    def _prune(self, now: float) -> None:
        arrivals = self._arrivals
        while arrivals and arrivals[0].expires <= now:
            self._leave(arrivals.popleft())

    def _leave(self, turn: _Turn) -> None:
        if self._latest.get(turn.key) is turn:
            del self._latest[turn.key]

    async def _dispatch(self, call: Call, next: Handler, turn: _Turn) -> Response:
        """`next(call)`'s response, unless a newer request supersedes this one first."""
        work = asyncio.ensure_future(next(call))
        try:
            await asyncio.wait((work, turn.superseded), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the client left: the work goes with it
            await _cancel(work)
            raise
        if turn.superseded.done():
            # NOTE: an answer that came in the same moment is discarded too: the newer request
            # arrived while this one was in flight, so the caller only wants the newer one.
            await _cancel(work)
            if not work.cancelled() and work.exception() is None:
                await _discard(work.result())
            raise self._refusal(call, turn, "dispatched")
        return work.result()

    async def _watched(
        self, call: Call, turn: _Turn, body: AsyncContentStream
    ) -> AsyncIterator[Content]:
        """`body`, cut with an SSE error event when a newer request supersedes this one.

        Within the window each chunk is awaited in a task raced against the supersession (the
        upstream read must be interruptible); after it, chunks pass straight through."""
        chunks = aiter(body)
        step: asyncio.Task[Content | None] | None = None
        try:
            while not turn.superseded.done() and self.deps.clock() < turn.expires:
                step = asyncio.ensure_future(_next(chunks))
                await asyncio.wait((step, turn.superseded), return_when=asyncio.FIRST_COMPLETED)
                if turn.superseded.done():
                    break
                chunk = step.result()
                step = None
                if chunk is None:
                    return
                yield chunk
            if turn.superseded.done():
                if step is not None:
                    await _cancel(step)
                    step = None
                await _close(chunks)
                self._refused(call, turn, "dispatched")
                yield stream_error_event(409, _message(turn), "superseded")
                return
            self._leave(turn)  # its window has passed: nothing can supersede it any more
            async for chunk in chunks:
                yield chunk
        finally:
            self._leave(turn)
            if step is not None and not step.done():
                # The client left while a chunk was awaited: the step's own task unwinds the
                # body (closing the upstream); cancellation may interrupt any await here.
                step.cancel()
                step.add_done_callback(_retrieve)
            else:
                await _close(chunks)

    def _refusal(self, call: Call, turn: _Turn, when: str) -> Failure:
        self._refused(call, turn, when)
        return Failure(error_response(409, _message(turn), code="superseded"), "superseded")

    def _refused(self, call: Call, turn: _Turn, when: str) -> None:
        self.deps.metrics.policies.superseded.labels(*call.policy_labels(), when).inc()
        service = call.service
        log.info(
            "request_id=%s superseded_by=%s service=%s/%s when=%s",
            call.request_id,
            turn.superseded.result(),
            service.namespace,
            service.name,
            when,
        )


def _message(turn: _Turn) -> str:
    return (
        f"superseded by a newer request of the same session (request id "
        f"{turn.superseded.result()}); with debouncing (LatestWins) only the newest request of "
        "a session is answered"
    )


async def _next(chunks: AsyncIterator[Content]) -> Content | None:
    """The next chunk, or None at the end (a task cannot carry StopAsyncIteration)."""
    try:
        return await anext(chunks)
    except StopAsyncIteration:
        return None


async def _cancel(work: asyncio.Future[Any]) -> None:
    """Cancel `work` and wait until it has unwound (its `finally` blocks release upstreams)."""
    work.cancel()
    await asyncio.wait((work,))
    _retrieve(work)


def _retrieve(work: asyncio.Future[Any]) -> None:
    """Mark `work`'s outcome as seen: an unseen exception is logged as an error at exit."""
    if not work.cancelled():
        work.exception()


async def _discard(response: Response) -> None:
    if isinstance(response, StreamingResponse):
        await _close(aiter(response.body_iterator))


async def _close(chunks: AsyncIterator[Content]) -> None:
    """Close a response body, started or not. A wrapping generator that never started skips
    its `finally`, but the engine's own stream is closed either way: the relay's `aclose`
    works unstarted, and the gateway runs `Call.closers` once the response is over."""
    aclose = getattr(chunks, "aclose", None)
    if aclose is not None:
        await aclose()
