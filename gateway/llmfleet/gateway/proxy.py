"""Forwarding to engines: pick, send, retry once elsewhere, relay bytes, account for it all.

Contracts:
- A connect error, a response that breaks before its headers, or a 5xx status is retried once on
  another endpoint of the same pool; after the first byte reached the client nothing is retried.
  A read timeout (headers, or a stream's next chunk) is answered 504 (or ends the stream with an
  error event), not retried, and ejects the endpoint at once: it is hung.
- When no endpoint is left to try: 503 (`Retry-After`) when none could be connected to
  (refused, unreachable, connect timeout: the request reached no engine, so the client may
  safely send it again), 502 when an engine failed it (5xx, broken before the headers) or the
  loopback guard refused every endpoint (a configuration that a retry does not change).
- Every `begin` on the endpoint table is matched by exactly one `end` (in `finally` blocks), also
  when the client leaves mid-stream: the in-flight counts feed routing.
- A stream whose engine fails mid-way ends with one SSE error event, never a hang; a client that
  leaves closes the upstream response, which closes its connection, so the engine sees it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import orjson
from starlette.responses import Response, StreamingResponse

from llmfleet.gateway.discovery import Pool, Role, Service
from llmfleet.gateway.endpoints import EndpointTable
from llmfleet.gateway.errors import error_response, stream_error_event
from llmfleet.gateway.metrics import GatewayMetrics, Labels
from llmfleet.gateway.openai_request import ParsedRequest
from llmfleet.gateway.routing.base import RoutingRequest
from llmfleet.gateway.routing.registry import PluginOptions, Scheduler
from llmfleet.gateway.settings import GatewaySettings
from llmfleet.gateway.upstream import (
    Upstream,
    UpstreamError,
    UpstreamRefusedNonLocal,
    UpstreamResponse,
    UpstreamTimeout,
)

log = logging.getLogger("llmfleet.gateway")

Priority = Literal["critical", "standard", "sheddable"]
"""Priority classes, highest first: at capacity critical is admitted first, sheddable shed first."""

ATTEMPTS = 2
"""The first try and one retry on another endpoint."""


@dataclass
class Call:
    """One client request as it moves through the gateway (and its traffic policies)."""

    request_id: str
    service: Service
    parsed: ParsedRequest
    routing: RoutingRequest
    path: str
    arrived: float
    raw: bytes = b""
    """The body as it will be sent upstream (the client's bytes unless a field was changed)."""
    tenant: str | None = None
    """The caller's tenant (from its API key); None without authentication."""
    session: str | None = None
    """Who the caller is within the tenant: the `x-session-id` header, else the body's `user`,
    else a digest of the API key; None when nothing identifies it."""
    priority: Priority = "standard"
    """The caller's priority class (its tenant's, or lower by the `x-llmfleet-priority` header)."""
    headers: Mapping[str, str] = field(default_factory=dict)
    """The client's request headers (lower-case names), for policies that read hints."""
    read_at: float | None = None
    """When the client's body was read (perf_counter); the first upstream send observes the
    time since as the gateway's `request` overhead, then clears it."""
    answered_at: float | None = None
    """When a whole (not streamed) upstream answer's last byte was read: the start of the
    gateway's `response` overhead."""
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    """Close the engine streams opened for this call; the gateway runs them when the client's
    response is over (or was never sent), so a stream that a policy wrapped but nobody read is
    still closed and accounted for. Shared by the call's `retarget` copies; a stage that gives
    a stream to other callers (coalescing) calls on with a list of its own."""

    def labels(self, pool: Role) -> Labels:
        service = self.service
        return (service.namespace, service.name, pool, service.model, service.revision)

    def policy_labels(self) -> tuple[str, str, str]:
        """Labels of the per-policy metrics: namespace, service, model."""
        return (self.service.namespace, self.service.name, self.service.model)

    def retarget(self, service: Service, body: dict[str, Any]) -> Call:
        """A copy of this call for another service (a cascade tier, a degradation target) with
        `body` (already naming that service's model) as its upstream body."""
        parsed = self.parsed.with_body(body, service.model)
        routing = replace(self.routing, model=service.model)
        return replace(self, service=service, parsed=parsed, routing=routing, raw=parsed.raw)


@dataclass
class Opened:
    """An upstream response whose headers arrived; its body is still to be read or streamed."""

    url: str
    pool: Role
    response: UpstreamResponse
    tokens: int
    closed: bool = False
    """Set by `Forwarder.close`: the response is closed and accounted for."""


@dataclass
class _Misses:
    """The endpoints `Forwarder.open` tried that did not serve the call, and why."""

    errors: list[str] = field(default_factory=list)
    unreached: bool = True
    """Every one failed to connect (refused, unreachable, connect timeout): no engine saw the
    request, so sending it again is safe."""

    def add(self, error: str, *, reached: bool) -> None:
        self.errors.append(error)
        self.unreached = self.unreached and not reached


class Failure(Exception):
    """The call cannot be served; `response` is the OpenAI-shaped answer to send instead."""

    def __init__(self, response: Response, outcome: str) -> None:
        super().__init__(outcome)
        self.response = response
        self.outcome = outcome


class Forwarder:
    def __init__(
        self,
        settings: GatewaySettings,
        upstream: Upstream,
        table: EndpointTable,
        metrics: GatewayMetrics,
    ) -> None:
        self.settings = settings
        self.upstream = upstream
        self.table = table
        self.metrics = metrics
        self._schedulers: dict[tuple[str, Role, str], Scheduler] = {}
        self._pool_in_flight: dict[tuple[str, Role], int] = {}
        profile = settings.profiles[settings.profile]
        self._profile = profile
        self._options = PluginOptions(bounded_load_factor=settings.bounded_load_factor)
        # Fail at start-up, not on the first request, when a profile names an unknown plugin.
        Scheduler.build(profile.filters, profile.scorers, profile.picker, self._options)
        self._streams: weakref.WeakSet[_Relay] = weakref.WeakSet()
        """The streams being relayed now (what `cut_streams` ends). Weak: a stream whose
        request was dropped unfinished must stay collectable, as its collection closes its
        engine connection (the engine then stops generating)."""

    def cut_streams(self) -> int:
        """End every stream still relayed with one SSE error event (`gateway_shutdown`), so a
        client sees why its answer stops instead of a truncated body; the engines' responses
        are closed. The server calls it just before its shutdown timeout cuts connections.
        Returns how many streams it ended."""
        streams = list(self._streams)
        for stream in streams:
            stream.cut()
        if streams:
            log.warning("shutting down: %d stream(s) still running ended with an error event",
                        len(streams))  # fmt: skip
        return len(streams)

    def scheduler(self, model: str, pool: Role, revision: str = "") -> Scheduler:
        key = (model, pool, revision)
        scheduler = self._schedulers.get(key)
        if scheduler is None:  # one per pool and revision: pickers keep per-pool state
            p = self._profile
            scheduler = Scheduler.build(p.filters, p.scorers, p.picker, self._options)
            self._schedulers[key] = scheduler
        return scheduler

    def in_flight(self, model: str, pool: Role) -> int:
        """Requests this gateway has in flight to a pool (what `admit` holds to its cap)."""
        return self._pool_in_flight.get((model, pool), 0)

    def admit(self, call: Call, pool: Role) -> None:
        """Refuse with 429 when the pool has `max_in_flight_per_pool` requests in flight."""
        key = (call.service.model, pool)
        if self._pool_in_flight.get(key, 0) >= self.settings.max_in_flight_per_pool:
            self.metrics.pool(call.labels(pool)).count_rejected()
            retry = str(self.settings.retry_after_seconds)
            raise Failure(
                error_response(
                    429,
                    f"pool {pool!r} of model {call.service.model!r} is at capacity; retry later",
                    code="pool_saturated",
                    headers={"Retry-After": retry},
                ),
                "rejected",
            )

    def _read_timeout(self, call: Call) -> float:
        return call.service.limits.timeout_seconds or self.settings.request_timeout_seconds

    async def open(self, call: Call, pool: Pool, body: bytes) -> Opened:
        """Send `body` to an endpoint of `pool` chosen by the profile; retry once elsewhere."""
        self.admit(call, pool.role)
        labels = call.labels(pool.role)
        tried: set[str] = set()
        misses = _Misses()
        headers = (("Content-Type", "application/json"), ("X-Request-Id", call.request_id))
        tokens = call.routing.tokens
        read_timeout = self._read_timeout(call)
        for attempt in range(ATTEMPTS):
            urls = [url for url in pool.endpoints if url not in tried]
            service = call.service
            candidate = self.scheduler(service.model, pool.role, service.revision).pick(
                call.routing, self.table.candidates(urls)
            )
            if candidate is None:
                break
            url = candidate.url
            tried.add(url)
            if attempt:
                self.metrics.pool(labels).count_retry()
            self._begin(call, pool.role, url, tokens)
            if call.read_at is not None:
                self.metrics.overhead(call.path, "request").observe(
                    time.perf_counter() - call.read_at
                )
                call.read_at = None
            try:
                response = await self.upstream.send(url + call.path, body, headers, read_timeout)
            except UpstreamTimeout as error:  # sent, but no answer in time: a hung engine
                self._end(call, pool.role, url, tokens)
                reason = f"no answer in {read_timeout:g}s: {error}"
                self._failed(call, pool.role, url, reason, hung=True)
                raise Failure(
                    error_response(504, f"the engine at {url} did not answer in time"), "timeout"
                ) from None
            except UpstreamRefusedNonLocal as error:  # never sent: logged once per endpoint
                self._end(call, pool.role, url, tokens)
                misses.add(f"{url}: {error}", reached=True)  # a misconfiguration: not retryable
                continue
            except UpstreamError as error:  # refused, reset before the headers, ...
                self._end(call, pool.role, url, tokens)
                failure = self._failed(call, pool.role, url, str(error))
                misses.add(failure, reached=not error.connecting)
                continue
            except BaseException:  # cancelled (the client left): keep the counts right
                self._end(call, pool.role, url, tokens)
                raise
            if response.status_code >= 500 and attempt + 1 < ATTEMPTS:
                await response.aclose()
                self._end(call, pool.role, url, tokens)
                reason = f"status {response.status_code}"
                misses.add(self._failed(call, pool.role, url, reason), reached=True)
                continue
            if response.status_code < 500:
                self.table.succeeded(url)
            return Opened(url, pool.role, response, tokens)
        raise Failure(self._unavailable(call, pool.role, misses), "unavailable")

    def _unavailable(self, call: Call, pool: Role, misses: _Misses) -> Response:
        """The answer when no endpoint served: 503 when none was tried or none could be
        reached (retryable), else 502."""
        model = call.service.model
        detail = "; ".join(misses.errors) or "no serving endpoint"
        if not misses.errors:
            status, code = 503, "no_endpoint"
            message = f"no endpoint of pool {pool!r} could serve model {model!r} ({detail})"
        elif misses.unreached:
            status, code = 503, "upstream_unreachable"
            message = (
                f"no endpoint of pool {pool!r} of model {model!r} could be reached; the "
                f"request reached no engine, retry it ({detail})"
            )
        else:
            status, code = 502, "upstream_unavailable"
            message = f"no endpoint of pool {pool!r} could serve model {model!r} ({detail})"
        retry = {"Retry-After": str(self.settings.retry_after_seconds)}
        return error_response(status, message, code=code, headers=retry)

    def _begin(self, call: Call, pool: Role, url: str, tokens: int) -> None:
        self.table.begin(url, tokens)
        key = (call.service.model, pool)
        self._pool_in_flight[key] = self._pool_in_flight.get(key, 0) + 1
        self.metrics.pool(call.labels(pool)).add_in_flight(1)

    def _end(self, call: Call, pool: Role, url: str, tokens: int) -> None:
        self.table.end(url, tokens)
        key = (call.service.model, pool)
        self._pool_in_flight[key] = self._pool_in_flight.get(key, 1) - 1
        self.metrics.pool(call.labels(pool)).add_in_flight(-1)

    def finish(self, call: Call, opened: Opened) -> None:
        self._end(call, opened.pool, opened.url, opened.tokens)

    def _failed(self, call: Call, pool: Role, url: str, reason: str, *, hung: bool = False) -> str:
        log.warning("request_id=%s endpoint=%s failed: %s", call.request_id, url, reason)
        if self.table.failed(url, hung=hung):
            self.metrics.pool(call.labels(pool)).count_ejection()
            log.warning("endpoint=%s ejected for %ss", url, self.settings.eject_seconds)
        return f"{url}: {reason}"

    async def read_json(self, call: Call, opened: Opened) -> dict[str, Any]:
        """The whole JSON body of an upstream response (the prefill step of P/D)."""
        try:
            data = await opened.response.aread()
        except UpstreamError as error:
            self._failed(call, opened.pool, opened.url, f"reading the response: {error}")
            raise Failure(
                error_response(502, f"the engine at {opened.url} broke off its answer"),
                "upstream_error",
            ) from None
        finally:
            await opened.response.aclose()
            self.finish(call, opened)
        try:
            value = orjson.loads(data)
        except ValueError:
            value = None
        if not isinstance(value, dict):
            raise Failure(
                error_response(502, f"the engine at {opened.url} answered with no JSON object"),
                "upstream_error",
            )
        return value

    def _headers(self, call: Call, opened: Opened, extra: dict[str, str]) -> dict[str, str]:
        service = call.service
        headers = {
            "x-request-id": call.request_id,
            "x-llmfleet-service": f"{service.namespace}/{service.name}",
            "x-llmfleet-pool": opened.pool,
            "x-llmfleet-endpoint": opened.url,
            **extra,
        }
        if service.revision:
            headers["x-llmfleet-revision"] = service.revision
        return headers

    async def relay(self, call: Call, opened: Opened, extra: dict[str, str]) -> Response:
        """The client's response: the engine's bytes, streamed when the engine streams."""
        upstream = opened.response
        headers = self._headers(call, opened, extra)
        media_type = upstream.content_type
        labels = call.labels(opened.pool)
        if not (call.parsed.stream and upstream.status_code == 200):
            try:
                data = await upstream.aread()
            except UpstreamError as error:
                self._failed(call, opened.pool, opened.url, f"reading the response: {error}")
                self.metrics.pool(labels).count_outcome("upstream_error")
                return error_response(502, f"the engine at {opened.url} broke off its answer")
            finally:
                await upstream.aclose()
                self.finish(call, opened)
            call.answered_at = time.perf_counter()
            response = Response(data, upstream.status_code, headers, media_type)
            self._done(call, labels, _outcome(upstream.status_code))
            return response
        relay = _Relay(self, call, opened, labels)
        self._streams.add(relay)
        call.closers.append(relay.aclose)
        return StreamingResponse(relay, upstream.status_code, headers, media_type)

    async def close(self, call: Call, opened: Opened, outcome: str) -> None:
        """Account for a streamed response once, then close it (the engine sees its client go).
        The accounting comes first: under a cancelled scope the `await` may not return."""
        if opened.closed:
            return
        opened.closed = True
        self.finish(call, opened)
        self._done(call, call.labels(opened.pool), outcome)
        await opened.response.aclose()

    def _done(self, call: Call, labels: Labels, outcome: str) -> None:
        pool = self.metrics.pool(labels)
        pool.count_outcome(outcome)
        pool.observe_e2e(time.perf_counter() - call.arrived)


class _Relay:
    """An engine's stream as the client's body: its chunks as they come (TTFT and ITL
    observed), then the accounting. Not an async generator on purpose: `aclose()` closes the
    engine's response even when iteration never started (a generator's `finally` would not
    run), and the gateway calls it for every stream it opened (`Call.closers`).

    An engine failing mid-stream ends the body with one SSE error event; so does the gateway's
    shutdown cutting the stream (`cut`)."""

    def __init__(self, forwarder: Forwarder, call: Call, opened: Opened, labels: Labels) -> None:
        self._forwarder = forwarder
        self._call = call
        self._opened = opened
        self._metrics = forwarder.metrics.pool(labels)
        self._chunks: AsyncIterator[bytes] | None = None
        self._last: float | None = None
        self._over = False
        self._cut = False
        self._reader: asyncio.Task[Any] | None = None
        """The task waiting for the engine's next chunk, while one waits (what `cut` wakes)."""

    def __aiter__(self) -> _Relay:
        return self

    def cut(self) -> None:
        """End the stream at its next step with the shutdown's error event: at once when it is
        waiting for the engine (that wait is cancelled, and the cancellation taken back)."""
        self._cut = True
        if self._reader is not None:
            self._reader.cancel()

    def was_cut(self) -> bool:
        return self._cut

    async def _cut_event(self) -> bytes:
        await self._end("cancelled")
        message = (
            "the gateway is shutting down and cut this stream (its shutdown timeout passed): "
            "the answer is incomplete; retry the request, another gateway replica answers it"
        )
        return stream_error_event(503, message, "gateway_shutdown")

    async def __anext__(self) -> bytes:
        if self._over or self._opened.closed:
            raise StopAsyncIteration
        if self._cut:
            return await self._cut_event()
        if self._chunks is None:
            self._chunks = self._opened.response.aiter_raw().__aiter__()
        self._reader = asyncio.current_task()
        try:
            chunk = await anext(self._chunks)
        except asyncio.CancelledError:
            reader = self._reader
            if self.was_cut() and reader is not None and reader.uncancel() == 0:
                # Our own cancellation (`cut`), nobody else's: taken back, the event sent.
                self._reader = None
                return await self._cut_event()
            await self._end("cancelled")  # the client left (or the task was cancelled)
            raise
        except StopAsyncIteration:
            await self._end("ok")
            raise
        except UpstreamError as error:  # broken, or stalled past the read timeout
            opened = self._opened
            self._forwarder._failed(
                self._call, opened.pool, opened.url, f"mid-stream: {error}",
                hung=isinstance(error, UpstreamTimeout),
            )  # fmt: skip
            await self._end("stream_error")
            message = f"the engine at {opened.url} failed mid-stream ({type(error).__name__})"
            return stream_error_event(502, message, "upstream_stream_error")
        except BaseException:
            await self._end("cancelled")
            raise
        finally:
            self._reader = None
        now = time.perf_counter()
        if self._last is None:
            self._metrics.observe_ttft(now - self._call.arrived)
        else:
            self._metrics.observe_itl(now - self._last)
        self._last = now
        return chunk

    async def aclose(self) -> None:
        await self._end("cancelled")

    async def _end(self, outcome: str) -> None:
        self._over = True
        self._forwarder._streams.discard(self)
        await self._forwarder.close(self._call, self._opened, outcome)


def _outcome(status: int) -> str:
    if status < 400:
        return "ok"
    if status < 500:
        return "client_error"
    return "upstream_error"
