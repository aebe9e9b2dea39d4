"""The gateway's ASGI app: `create_app(settings, ...)` builds everything; nothing is global.

The two completion routes (POST /v1/chat/completions, /v1/completions) are served by
`GatewayApp` itself, straight on ASGI: no framework middleware, router, request or response
objects per request. Everything else (GET /v1/models, /healthz, /readyz, and the lifespan) goes
to a FastAPI app, where per-request cost does not matter; so do the admin routes (/metrics,
/docs, /redoc, /openapi.json), unless `admin_port` moves them to an app of their own on that
port. With `admin_requires_key` they answer only requests with a valid API key. With API keys,
`/v1/models` lists only the models the caller's key may use.

One request, in order: headers (request id sanitised), body (size limit, read deadline),
authentication, the few fields the gateway acts on (`openai_request`), the service, the
tenant's rate limit, the token cap (spliced into the body's bytes), the traffic policies, the
engines; then the answer is written to the client. One task watches for the client leaving and
cancels the work (closing the engine's stream). Every refusal is a 4xx in OpenAI's shape and
counted (`llmfleet_gateway_bad_requests_total` for malformed input); an unexpected exception is
a 500 in that shape with the request id, logged once with its traceback and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import anyio
import httpx
from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response, StreamingResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llmfleet.core.gc_paused import collector_paused
from llmfleet.core.loopback import LoopbackGuard, guarded
from llmfleet.core.tasks import cancel_and_wait
from llmfleet.gateway import openai_request
from llmfleet.gateway.discovery import Discovery, Role, Service, StaticDiscovery, for_session
from llmfleet.gateway.endpoints import Clock, EndpointTable
from llmfleet.gateway.errors import error_response
from llmfleet.gateway.gc_pauses import (
    PauseRecorder,
    Refreezer,
    became_ready,
    freeze_startup_heap,
)
from llmfleet.gateway.keys_reload import KeysReloader
from llmfleet.gateway.kube_discovery import KubeDiscovery, kubernetes_lister
from llmfleet.gateway.kube_secrets import read_keys_secret
from llmfleet.gateway.loop_lag import LoopLag
from llmfleet.gateway.metrics import GatewayMetrics, Pace
from llmfleet.gateway.openai_request import MAX_CONTEXT_TOKENS, InvalidRequestError, capped
from llmfleet.gateway.pd import serve_disaggregated
from llmfleet.gateway.policies.base import Handler, PolicyDeps, Stage, chain
from llmfleet.gateway.policies.cascade import Cascade
from llmfleet.gateway.policies.coalesce import Coalescer
from llmfleet.gateway.policies.debounce import Debouncer
from llmfleet.gateway.policies.priority import Admission
from llmfleet.gateway.policies.timeout import Deadline
from llmfleet.gateway.proxy import Call, Failure, Forwarder, Priority
from llmfleet.gateway.routing.base import RoutingRequest
from llmfleet.gateway.scraper import Scraper
from llmfleet.gateway.settings import GatewaySettings
from llmfleet.gateway.tenants import Tenants, TenantsError
from llmfleet.gateway.upstream import AiohttpUpstream, HttpxUpstream, Upstream
from llmfleet.gateway.wire import WireUpstream

log = logging.getLogger("llmfleet.gateway")

STAGES: tuple[Callable[[PolicyDeps], Stage], ...] = (
    Deadline,
    Debouncer,
    Coalescer,
    Admission,
    Cascade,
)
"""The traffic policies every request passes, outermost first (see `policies/__init__`)."""

PRIORITIES: tuple[Priority, ...] = ("critical", "standard", "sheddable")

ROUTES = {"/v1/chat/completions": True, "/v1/completions": False}
"""The routes served on the hot path, and whether each is the chat one."""

ADMIN_ROUTES = frozenset({"/metrics", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
"""What an operator, not a client, reads: the gateway's metrics and its API's documentation."""

PACE = Pace()
"""How /metrics is rendered: a millisecond at a time, in a thread (`metrics.Pace`)."""
SCRAPE_KEEPALIVE_INTERVALS = 3
"""The scraper's idle connections are kept this many scrape intervals (the next scrape of an
engine with traffic comes after one, ±10%, or a little later when the scrape budget is spent)."""
_ID_PREFIX = os.urandom(8).hex()
_ID_COUNTER = itertools.count()
"""Request ids the gateway makes: a random per-process prefix and a counter (32 hex digits,
unique across replicas; `uuid4` costs a system call per request)."""

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}")
"""A client's `x-request-id` is kept when it is this (printable ASCII, no spaces, short);
otherwise the gateway makes one (and logs the client's, escaped, once)."""


def _discovery_from(settings: GatewaySettings) -> Discovery:
    """The static file when one is given, else the Kubernetes API."""
    if settings.static_config is not None:
        return StaticDiscovery.from_file(settings.static_config)
    kubeconfig = str(settings.kubeconfig) if settings.kubeconfig else None
    try:
        lister = kubernetes_lister(kubeconfig, settings.namespace)
    except Exception as error:  # the client's config errors have no common base
        raise ValueError(
            "no discovery source: pass --static-config FILE, or --kubeconfig FILE (or run in a "
            f"cluster) for Kubernetes discovery ({type(error).__name__}: {error})"
        ) from error
    return KubeDiscovery(lister, settings.discovery_interval_seconds)


def _upstream_from(
    settings: GatewaySettings,
    transport: httpx.AsyncBaseTransport | None,
    guard: LoopbackGuard,
    name: str = "upstream",
    keepalive_seconds: float = 30.0,
) -> Upstream:
    """The gateway's own client (`wire.py`) unless a test passes a transport or the settings
    ask for aiohttp or httpx. The forwarder's is `upstream`, the scraper's `scrape` (its own
    connections; `name` labels the loopback guard's refusals); idle connections are kept for
    `keepalive_seconds`."""
    connect = settings.connect_timeout_seconds
    keepalive = keepalive_seconds
    if transport is None and settings.upstream_client == "wire":
        return WireUpstream(guard, connect_timeout=connect, keepalive_seconds=keepalive, name=name)
    if transport is None and settings.upstream_client == "aiohttp":
        return AiohttpUpstream(
            guard, connect_timeout=connect, keepalive_seconds=keepalive, name=name
        )
    limits = httpx.Limits(
        max_connections=None,
        max_keepalive_connections=settings.keepalive_connections,
        keepalive_expiry=keepalive,
    )
    client = httpx.AsyncClient(
        transport=guarded(transport, guard, name, limits), limits=limits, timeout=None
    )
    return HttpxUpstream(client, connect_timeout=connect)


class Warmed:
    """Whether the gateway has made its discovered fleet's routing state and frozen it
    (`_freeze_when_discovered`): /readyz waits for it as well as for discovery. At 1,000
    services that work holds the event loop ~100 ms in one go; done before the gateway says it
    is ready, no request routed to it waits it out."""

    def __init__(self) -> None:
        self.done = False


async def _freeze_when_discovered(
    source: Discovery, forwarder: Forwarder, table: EndpointTable, warmed: Warmed
) -> None:
    """The heap frozen once more with the fleet discovery found (`gc_pauses`), and with the
    state its pools' requests will need (`prepare_pools`); then `warmed`."""
    try:
        if not await became_ready(source.ready):
            return
        started = time.perf_counter()
        pools = prepare_pools(source, forwarder, table)
        frozen = freeze_startup_heap()
        log.info("froze %d objects with the discovered fleet (%d pools) out of the garbage "
                 "collector's way (%.0f ms)", frozen, pools,
                 (time.perf_counter() - started) * 1000)  # fmt: skip
    finally:
        warmed.done = True  # also when it gave up waiting, or failed: readiness is discovery's


def prepare_pools(source: Discovery, forwarder: Forwarder, table: EndpointTable) -> int:
    """Make every discovered pool's routing state now, not at its first request: its
    scheduler (filters, scorers, picker) and its endpoints' states; the count of pools. Made
    before the heap is frozen with the fleet, this state is frozen with it; made by first
    requests, it was walked by the full collections of the first minutes under load, while
    traffic reached pool after pool (bench/gateway_fleet_scale.py). Pools discovered later get
    theirs at their first request, as before.

    The pool's series are not made here: they would then exist from start-up, ~45 per pool
    whether or not it ever serves (45,000 at 1,000 pools in every /metrics read), a cost that
    would grow with the fleet rather than with its traffic; they are two tracked objects a pool
    (`pool_metrics`), so made by first requests they cost full collections little."""
    pools = 0
    for service in source.services().values():
        revisions = [service] if service.canary is None else [service, service.canary.service]
        for revision in revisions:
            for role, pool in revision.pools.items():
                forwarder.scheduler(revision.model, role, revision.revision)
                for url in pool.endpoints:
                    table.get(url)
                pools += 1
    return pools


def _freeze(
    settings: GatewaySettings,
    source: Discovery,
    refreezer: Refreezer | None,
    *,
    forwarder: Forwarder,
    table: EndpointTable,
    warmed: Warmed,
) -> list[asyncio.Task[None]]:
    """The heap frozen now, and the tasks that freeze it again: once the fleet is discovered
    (then `warmed`), and after long full collections (`gc_pauses`); none without
    `freeze_startup_heap` (`warmed` at once)."""
    if not settings.freeze_startup_heap:
        warmed.done = True
        return []
    frozen = freeze_startup_heap()
    log.info("froze %d start-up objects out of the garbage collector's way", frozen)
    tasks = [asyncio.create_task(_freeze_when_discovered(source, forwarder, table, warmed))]
    if refreezer is not None:
        tasks.append(asyncio.create_task(refreezer.forever()))
    return tasks


def _refreezer_from(settings: GatewaySettings, metrics: GatewayMetrics) -> Refreezer | None:
    """The heap frozen again after a long full collection (`gc_pauses`), when asked for."""
    after = settings.refreeze_after_pause_seconds
    if not settings.freeze_startup_heap or after is None:
        return None

    def frozen(paused: float) -> None:
        metrics.gc_refreezes.inc()
        log.info("a full garbage collection took %.0f ms of CPU: froze what it left alive too",
                 paused * 1000)  # fmt: skip

    return Refreezer(after, on_freeze=frozen)


def create_app(
    settings: GatewaySettings,
    *,
    discovery: Discovery | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    tenants: Tenants | None = None,
    clock: Clock = time.monotonic,
) -> GatewayApp:
    """The gateway app. `discovery` defaults to the static file in the settings, `tenants` to
    its API keys file (none: no authentication); `transport` replaces the network for the
    engines (tests pass an `httpx.MockTransport`)."""
    if settings.profile not in settings.profiles:
        known = ", ".join(sorted(settings.profiles))
        raise ValueError(f"unknown routing profile {settings.profile!r} (known: {known})")
    source = discovery if discovery is not None else _discovery_from(settings)
    reloader: KeysReloader | None = None
    if tenants is None:
        reloader = _keys_from(settings, clock)
        tenants = reloader.tenants if reloader is not None else None
    if settings.require_api_keys and tenants is None:
        raise ValueError(
            "require_api_keys is set and no API keys are configured (api_keys_file or "
            "api_keys_secret): the gateway would serve everyone. Give keys, or turn "
            "require_api_keys off (the chart: gateway.auth: none)"
        )
    if settings.admin_requires_key and tenants is None:
        raise ValueError(
            "admin_requires_key needs API keys (api_keys_file or api_keys_secret): without "
            "them no request could read /metrics or /docs"
        )
    metrics = GatewayMetrics(discovered=source.services)
    table = EndpointTable(
        eject_after_failures=settings.eject_after_failures,
        eject_seconds=settings.eject_seconds,
        stale_seconds=settings.metrics_stale_seconds,
        clock=clock,
    )
    guard = LoopbackGuard(
        settings.loopback_only, lambda client: metrics.nonlocal_refused.labels(client).inc(), log
    )
    upstream = _upstream_from(settings, transport, guard)
    # The scraper bounds its own scrapes in flight (`scrape_concurrency`). Its connections are
    # kept only until the next scrape of a pool with traffic is due: an engine scraped less
    # often (the fleet's scrapes past `scrape_max_per_second`) would otherwise hold a socket,
    # and ~10 objects for the collector to walk, per engine of the fleet.
    scrape_keepalive = SCRAPE_KEEPALIVE_INTERVALS * settings.scrape_interval_seconds
    scrape_upstream = _upstream_from(settings, transport, guard, "scrape", scrape_keepalive)
    scraper = Scraper(scrape_upstream, table, source, metrics, settings, clock=clock)
    forwarder = Forwarder(settings, upstream, table, metrics)
    refreezer = _refreezer_from(settings, metrics)
    pauses = PauseRecorder(metrics.gc_pauses, refreezer, cpu_histogram=metrics.gc_pause_cpu)
    warmed = Warmed()

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # anyio imports its asyncio backend at first use: the first streamed answer's task
        # group (starlette's StreamingResponse), 15-35 ms on the event loop in the middle of
        # traffic at 1,000 x 10 (bench/_stall_probe.py). Loaded now, before the first request
        # (anyio comes with starlette).
        await anyio.sleep(0)
        await source.start()
        scraping = asyncio.create_task(scraper.forever())
        freezing = _freeze(settings, source, refreezer, forwarder=forwarder, table=table,
                           warmed=warmed)  # fmt: skip
        pauses.start()
        lag = LoopLag.started(
            metrics.loop_lag,
            metrics.loop_lag_max,
            own=metrics.loop_own_lag,
            own_largest=metrics.loop_own_lag_max,
            cpu_wait=metrics.loop_cpu_wait,
        )
        reloading = (
            asyncio.create_task(reloader.forever(settings.api_keys_reload_seconds))
            if reloader is not None and settings.api_keys_reload_seconds > 0
            else None
        )
        try:
            yield
        finally:
            for task in freezing:
                await cancel_and_wait(task)
            await cancel_and_wait(reloading)
            pauses.stop()
            await lag.stop()
            await cancel_and_wait(scraping)
            await source.stop()
            await upstream.aclose()
            await scrape_upstream.aclose()

    admin, operations = _admin_apps(settings, source, metrics, tenants, lifespan, warmed=warmed)
    gateway = _Gateway(settings, source, forwarder, metrics, tenants, table, clock)
    key_guard = tenants if settings.admin_requires_key else None
    return GatewayApp(admin, gateway, forwarder, table, metrics, operations, key_guard)


def _keys_from(settings: GatewaySettings, clock: Clock) -> KeysReloader | None:
    """The API keys the settings name (a file, else a Secret), read now, with what re-reads
    them; None when they name none."""
    replicas = settings.limit_replicas
    if settings.api_keys_file is not None:
        path = settings.api_keys_file
        read: Callable[[], str] = path.read_text
        where = str(path)
    elif settings.api_keys_secret is not None:
        reference = settings.api_keys_secret
        kubeconfig = str(settings.kubeconfig) if settings.kubeconfig else None
        read, where = (lambda: read_keys_secret(reference, kubeconfig)), f"Secret {reference}"
    else:
        return None
    try:
        text = read()
    except OSError as error:
        raise TenantsError(f"cannot read API keys file {where}: {error}") from error
    return KeysReloader(Tenants.parse(text, clock, replicas), read, where, text)


def _admin_apps(
    settings: GatewaySettings,
    source: Discovery,
    metrics: GatewayMetrics,
    tenants: Tenants | None,
    lifespan: Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]],
    *,
    warmed: Warmed,
) -> tuple[FastAPI, FastAPI | None]:
    """The FastAPI app of the API port (with the lifespan) and, with `admin_port`, the admin
    port's app; the admin routes are on the second when it exists, else on the first."""
    separate = settings.admin_port is not None
    admin = FastAPI(
        title="llmfleet gateway", version="v1", lifespan=lifespan,
        docs_url=None if separate else "/docs", redoc_url=None if separate else "/redoc",
        openapi_url=None if separate else "/openapi.json",
    )  # fmt: skip
    _probes(admin, source, warmed)

    @admin.get("/v1/models")
    async def models(request: Request) -> Any:
        """The served models; with API keys, those the caller's key may use."""
        tenant = None
        if tenants is not None:
            tenant = tenants.identify(request.headers.get("authorization"))
            if tenant is None:
                return _key_required()
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": service.namespace}
            for name, service in sorted(source.services().items())
            if tenant is None or tenant.may_use(name)
        ]
        return {"object": "list", "data": data}

    _document_completion_routes(admin)
    operations: FastAPI | None = None
    if separate:
        # Its /openapi.json documents the API port's routes (`admin`'s), not its own.
        operations = FastAPI(title="llmfleet gateway", version="v1")
        operations.openapi = admin.openapi  # type: ignore[method-assign]
        _probes(operations, source, warmed)
    _metrics_route(operations or admin, metrics)
    return admin, operations


def _key_required() -> Response:
    return error_response(
        401, "a valid API key is required (Authorization: Bearer KEY)", code="invalid_api_key"
    )


def _probes(app: FastAPI, source: Discovery, warmed: Warmed) -> None:
    """OpenAI-shaped errors, /healthz and /readyz: on every port the gateway serves."""

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, error: StarletteHTTPException) -> Response:
        return error_response(error.status_code, str(error.detail))

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> Response:
        if not source.ready():
            return error_response(503, "discovery has no snapshot yet", code="not_ready")
        if not warmed.done:
            return error_response(
                503, "preparing the discovered fleet's routing state", code="not_ready"
            )
        return Response(b'{"status":"ready"}', media_type="application/json")


def _metrics_route(app: FastAPI, metrics: GatewayMetrics) -> None:
    @app.get("/metrics")
    async def prometheus(request: Request) -> Response:
        # Rendered in a thread: at 1,000 services the per-service series make it megabytes,
        # about a second of work that, on the event loop, every request in flight waited out
        # (the scale benchmark's polls showed loop lag past 1 s). prometheus_client copies each
        # metric's children under its lock, and discovery's snapshot is immutable.
        # Paced (`metrics.Pace`), with the collector paused meanwhile (`core.gc_paused`): the
        # render makes ~60k samples at 1,000 pools that live for the whole render; collected
        # meanwhile, they were promoted and walked by full collections (10-25 ms each), and a
        # `Refreezer` took those pauses for state that lasts.
        # ?name[]=... (as prometheus_client's own handler): only those families.
        # Sent in chunks (`Pace.chunk_bytes`), never joined into one buffer.
        names = request.query_params.getlist("name[]")
        metrics.forget_gone_pools()  # a deleted service's series end here
        chunks = await asyncio.to_thread(_exposition, metrics, names)
        media_type = "text/plain; version=0.0.4"
        if len(chunks) == 1:
            return Response(chunks[0], media_type=media_type)

        async def body() -> AsyncIterator[bytes]:
            for chunk in chunks:
                yield chunk

        length = sum(len(chunk) for chunk in chunks)
        return StreamingResponse(
            body(), media_type=media_type, headers={"content-length": str(length)}
        )


def _exposition(metrics: GatewayMetrics, names: list[str]) -> list[bytes]:
    with collector_paused():
        return metrics.exposition_chunks(PACE, names)


class _KeyGuard:
    """An ASGI app in front of `app`: the admin routes answer 401 without a valid API key."""

    def __init__(self, app: ASGIApp, tenants: Tenants) -> None:
        self.app = app
        self.tenants = tenants

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in ADMIN_ROUTES:
            authorization = next(
                (value.decode("latin-1") for name, value in scope["headers"]
                 if name == b"authorization"),
                None,
            )  # fmt: skip
            if self.tenants.identify(authorization) is None:
                await _key_required()(scope, receive, send)
                return
        await self.app(scope, receive, send)


class GatewayApp:
    """The ASGI app: the completion routes on the hot path, everything else to FastAPI.
    `operations` is the admin port's app (None: the admin routes are served here); `state`
    exposes the forwarder, endpoint table and metrics to tests and benchmarks."""

    def __init__(  # noqa: PLR0917 - the wiring's parts, named once in create_app
        self,
        admin: FastAPI,
        gateway: _Gateway,
        forwarder: Forwarder,
        table: EndpointTable,
        metrics: GatewayMetrics,
        operations: FastAPI | None = None,
        key_guard: Tenants | None = None,
    ) -> None:
        self.admin: ASGIApp = admin if key_guard is None else _KeyGuard(admin, key_guard)
        self.operations: ASGIApp | None = operations
        if operations is not None and key_guard is not None:
            self.operations = _KeyGuard(operations, key_guard)
        self._gateway = gateway
        self.state = admin.state
        self.state.forwarder = forwarder
        self.state.table = table
        self.state.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            chat = ROUTES.get(scope["path"])
            if chat is not None:
                await self._gateway.serve_http(scope, receive, send, scope["path"], chat)
                return
        await self.admin(scope, receive, send)


_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
_ERROR_STATUSES = {
    "400": "Malformed request: not JSON, invalid Unicode, too deep, a wrong type or value",
    "401": "A valid API key is required",
    "404": "No such model",
    "408": "The body was not received in time",
    "409": "Superseded by a newer request of the same session (debouncing)",
    "413": "The body is larger than the gateway's limit",
    "429": "Rate limited, or the pool is saturated",
    "499": "The client left (not sent)",
    "500": "An unexpected error in the gateway",
    "502": "The engines failed",
    "503": "No serving endpoint, none reachable (the request reached no engine), or the "
    "gateway is starting",
    "504": "The engine did not answer in time",
}


def _document_completion_routes(admin: FastAPI) -> None:
    """Put the two hot-path routes (served outside FastAPI) into /openapi.json."""

    def openapi() -> dict[str, Any]:
        if admin.openapi_schema is None:
            schema = FastAPI.openapi(admin)
            errors = {
                status: {
                    "description": text,
                    "content": {"application/json": {"schema": _ERROR_SCHEMA}},
                }
                for status, text in _ERROR_STATUSES.items()
            }
            for path, chat in ROUTES.items():
                schema["paths"][path] = {
                    "post": {
                        "summary": "Chat completion" if chat else "Completion",
                        "requestBody": {
                            "required": True,
                            "content": {
                                "application/json": {"schema": openai_request.openapi_schema(chat)}
                            },
                        },
                        "responses": {
                            "200": {
                                "description": "The engine's answer: JSON, or server-sent "
                                "events when `stream` is true",
                                "content": {
                                    "application/json": {"schema": {"type": "object"}},
                                    "text/event-stream": {"schema": {"type": "string"}},
                                },
                            },
                            **errors,
                        },
                    }
                }
            admin.openapi_schema = schema
        return admin.openapi_schema

    admin.openapi = openapi  # type: ignore[method-assign]


class _ClientLeft(Exception):
    """The client disconnected before the answer was written."""


class _Gateway:
    """Per-request work, kept out of `create_app` so the factory stays a wiring diagram."""

    def __init__(  # noqa: PLR0917 - the wiring's parts, named once in create_app
        self,
        settings: GatewaySettings,
        source: Discovery,
        forwarder: Forwarder,
        metrics: GatewayMetrics,
        tenants: Tenants | None,
        table: EndpointTable,
        clock: Clock,
    ) -> None:
        self.settings = settings
        self.source = source
        self.forwarder = forwarder
        self.metrics = metrics
        self.tenants = tenants
        deps = PolicyDeps(settings, metrics, source, table, forwarder, self._forward, clock)
        self.serve: Handler = chain([stage(deps) for stage in STAGES], self._forward)

    async def serve_http(
        self, scope: Scope, receive: Receive, send: Send, route: str, chat: bool
    ) -> None:
        """Answer one request on a completion route; never raises (but for cancellation)."""
        arrived = time.perf_counter()
        headers = {
            name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]
        }
        request_id = _request_id(headers.get("x-request-id"))
        writer = _Writer(send, request_id)
        try:
            try:
                raw = await self._read_body(receive, headers)
                call = self._prepare(raw, headers, request_id, route, chat, arrived)
            except _Refused as refused:
                if refused.bad_request is not None:
                    self.metrics.bad_requests.labels(route, refused.bad_request).inc()
                await writer.write(refused.response)
                return
            await self._answer(call, receive, writer)
        except _ClientLeft:
            return
        except Exception:
            self.metrics.internal_errors.labels(route).inc()
            log.exception("request_id=%s unexpected error on %s", request_id, route)
            if not writer.started:
                message = f"internal error in the gateway (request id {request_id})"
                await writer.write(error_response(500, message, code="internal_error"))

    async def _read_body(self, receive: Receive, headers: Mapping[str, str]) -> bytes:
        """The whole body, within `max_body_bytes` and `body_read_timeout_seconds`."""
        limit = self.settings.max_body_bytes
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            raise _Refused.bad(413, f"the request body is larger than {limit} bytes",
                               "body_too_large")  # fmt: skip
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.settings.body_read_timeout_seconds):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        raise _ClientLeft
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > limit:
                        raise _Refused.bad(413, f"the request body is larger than {limit} bytes",
                                           "body_too_large")  # fmt: skip
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            seconds = self.settings.body_read_timeout_seconds
            raise _Refused.bad(
                408, f"the request body was not received within {seconds:g}s", "body_read_timeout"
            ) from None
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _answer(self, call: Call, receive: Receive, writer: _Writer) -> None:
        """Run the policies and the engines, write the answer; the client leaving cancels."""
        watcher = _DisconnectWatcher(receive)
        service = call.service
        try:
            try:
                response = await self.serve(call)
            except Failure as failure:
                self.metrics.pool(call.labels(_pool(service))).count_outcome(failure.outcome)
                response = failure.response
            await writer.write(response, self.metrics.overhead(call.path, "chunk"))
            response_overhead = call.answered_at
            if response_overhead is not None and not isinstance(response, StreamingResponse):
                self.metrics.overhead(call.path, "response").observe(
                    time.perf_counter() - response_overhead
                )
        except asyncio.CancelledError:
            if not watcher.fired:
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            if not writer.started:
                log.info("request_id=%s client left before the answer; cancelled", call.request_id)
                self.metrics.pool(call.labels(_pool(service))).count_outcome("cancelled")
        finally:
            watcher.stop()
            await _close_all(call)

    def _prepare(  # noqa: PLR0917 - one request's parts, read in serve_http
        self,
        raw: bytes,
        headers: Mapping[str, str],
        request_id: str,
        route: str,
        chat: bool,
        arrived: float,
    ) -> Call:
        """Authenticate, parse, find the service, apply limits; _Refused says why not."""
        read_at = time.perf_counter()
        tenant = None
        if self.tenants is not None:
            tenant = self.tenants.identify(headers.get("authorization"))
            if tenant is None:
                message = "a valid API key is required (Authorization: Bearer KEY)"
                raise _Refused(error_response(401, message, code="invalid_api_key"))
        try:
            parsed = openai_request.parse(raw, chat=chat)
        except InvalidRequestError as error:
            response = error_response(400, str(error), param=error.param, code="invalid_request")
            raise _Refused(response, bad_request="invalid_request") from None
        if tenant is not None and not tenant.may_use(parsed.model):
            # Answered as a model that does not exist: a key learns nothing of other models.
            raise _Refused(error_response(404, _no_such_model(parsed.model, True),
                                          code="model_not_found"))  # fmt: skip
        service = self.source.services().get(parsed.model)
        if service is None and not self.source.ready():
            # A gateway that just started does not know the models yet: "try again", not 404.
            message = "the gateway is starting: service discovery has no snapshot yet"
            raise _Refused(
                error_response(503, message, code="not_ready", headers={"Retry-After": "1"})
            )
        if service is None:
            message = _no_such_model(parsed.model, tenant is not None)
            raise _Refused(error_response(404, message, code="model_not_found"))
        session = _session(headers, parsed)
        if service.canary is not None:  # a canary rollout: this session's revision
            service = for_session(service, session or request_id)
        if tenant is not None and self.tenants is not None:
            wait = self.tenants.retry_after(tenant, parsed.tokens())
            if wait:
                labels = (service.namespace, service.name, _pool(service), service.model,
                          service.revision)  # fmt: skip
                self.metrics.pool(labels).count_outcome("rate_limited")
                raise _Refused(
                    error_response(
                        429,
                        f"tenant {tenant.name!r} is over its requests or tokens per minute",
                        code="rate_limit_exceeded",
                        headers={"Retry-After": str(wait)},
                    )
                )
        cap = service.limits.max_tokens or self.settings.max_tokens
        parsed = capped(parsed, cap, service.max_model_len or MAX_CONTEXT_TOKENS) or parsed
        routing = RoutingRequest(
            parsed.model,
            parsed.prefix_key(self.settings.prefix_block_chars, self.settings.prefix_blocks),
            parsed.tokens(),
        )
        return Call(
            request_id,
            service,
            parsed,
            routing,
            route,
            arrived,
            raw=parsed.raw,
            tenant=tenant.name if tenant is not None else None,
            session=session,
            # A tenant without a class is standard, and so its ceiling (not "no tenants").
            priority=_priority((tenant.priority or "standard") if tenant else None, headers),
            headers=headers,
            read_at=read_at,
        )

    async def _forward(self, call: Call) -> Response:
        """The end of the chain: the service's engines."""
        if call.service.disaggregated:
            response: Response = await serve_disaggregated(self.forwarder, call, call.raw)
            return response
        opened = await self.forwarder.open(call, call.service.pools["unified"], call.raw)
        return await self.forwarder.relay(call, opened, {})


def _no_such_model(model: str, keys: bool) -> str:
    if keys:
        return f"the model `{model}` does not exist or your API key may not use it"
    return f"the model `{model}` does not exist"


def _request_id(given: str | None) -> str:
    """The client's `x-request-id` if it is a sane token, else a new one."""
    if given is not None and _REQUEST_ID.fullmatch(given):
        return given
    made = f"{_ID_PREFIX}{next(_ID_COUNTER):016x}"
    if given is not None:
        log.info("request_id=%s replaces the client's unusable x-request-id %r", made, given[:64])
    return made


class _Writer:
    """Writes a Starlette response to the ASGI `send` without Starlette's per-response
    machinery (its StreamingResponse starts a task group and a disconnect listener; the
    gateway has one watcher per request already). A `send` that fails because the connection
    is gone raises `_ClientLeft`."""

    def __init__(self, send: Send, request_id: str) -> None:
        self._raw_send = send
        self._request_id = request_id.encode()
        self.started = False

    async def _send(self, message: Message) -> None:
        try:
            await self._raw_send(message)
        except OSError:  # the server's transport broke under it: the client is gone
            raise _ClientLeft from None

    async def write(self, response: Response, chunk_overhead: Any = None) -> None:
        headers = response.raw_headers
        if not any(name == b"x-request-id" for name, _ in headers):
            headers = [*headers, (b"x-request-id", self._request_id)]
        self.started = True
        await self._send(
            {"type": "http.response.start", "status": response.status_code, "headers": headers}
        )
        if not isinstance(response, StreamingResponse):
            await self._send({"type": "http.response.body", "body": response.body})
            return
        send = self._send
        async for chunk in response.body_iterator:
            got = time.perf_counter()
            body = chunk if isinstance(chunk, bytes) else _as_bytes(chunk)
            await send({"type": "http.response.body", "body": body, "more_body": True})
            if chunk_overhead is not None:
                chunk_overhead.observe(time.perf_counter() - got)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _as_bytes(chunk: Any) -> bytes:
    return bytes(chunk) if isinstance(chunk, memoryview) else str(chunk).encode()


class _DisconnectWatcher:
    """One task per request waiting for `http.disconnect`; when it comes, the serving task is
    cancelled (`fired` tells that cancellation from any other). The body has been read, so the
    next ASGI message can only be the disconnect (uvicorn sends it when the connection drops,
    or after the response is complete, by which time the watcher is stopped)."""

    def __init__(self, receive: Receive) -> None:
        self.fired = False
        self._target = asyncio.current_task()
        self._task = asyncio.ensure_future(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        try:
            message: Message = await receive()
            while message["type"] != "http.disconnect":
                message = await receive()
        except asyncio.CancelledError:
            # `stop`: the watcher ends without an error. A task that ended cancelled keeps its
            # CancelledError, whose traceback holds this frame, whose `self` holds the task: a
            # reference cycle per request (~20 objects), and at 600 req/s the collector's full
            # passes over them were 7-15 ms pauses of the event loop.
            return
        self.fired = True
        if self._target is not None:
            self._target.cancel()

    def stop(self) -> None:
        self._task.cancel()


def _session(headers: Mapping[str, str], parsed: openai_request.ParsedRequest) -> str | None:
    """Who the caller is within its tenant: `x-session-id`, else the body's `user`, else a
    digest of the API key (never the key itself: it may end up in logs); None if nothing."""
    session = headers.get("x-session-id")
    if session:
        return f"s:{session}"
    if parsed.user:
        return f"u:{parsed.user}"
    authorization = headers.get("authorization")
    if authorization:
        return "k:" + hashlib.sha256(authorization.encode()).hexdigest()[:16]
    return None


def _priority(ceiling: Priority | None, headers: Mapping[str, str]) -> Priority:
    """The tenant's class `ceiling`, or a lower one the request asks for with
    `x-llmfleet-priority`: a request can never raise itself above its tenant. Without tenants
    (`ceiling` None) the header is taken as is; without a valid header the class is standard."""
    own: Priority = ceiling or "standard"
    asked = headers.get("x-llmfleet-priority", "").strip().lower()
    if asked in PRIORITIES and PRIORITIES.index(asked) > PRIORITIES.index(own):
        return asked
    if asked in PRIORITIES and ceiling is None:  # no tenants: the header is all there is
        return asked
    return own


async def _close_all(call: Call) -> None:
    """Close every engine stream opened for `call` that is still open (see `Call.closers`)."""
    for close in call.closers:
        try:
            await close()
        except Exception as error:  # closing a broken connection: nothing left to save
            log.debug("request_id=%s closing an engine stream: %s", call.request_id, error)
    # A closer is a stream's bound method and the stream holds the call: left in the list, each
    # streamed request would be a reference cycle for the garbage collector (see
    # `_DisconnectWatcher._watch`).
    call.closers.clear()


class _Refused(Exception):
    """The request is answered by the gateway itself with `response` (4xx); `bad_request` is
    the code it is counted under when the input itself was at fault."""

    def __init__(self, response: Response, bad_request: str | None = None) -> None:
        super().__init__(response.status_code)
        self.response = response
        self.bad_request = bad_request

    @classmethod
    def bad(cls, status: int, message: str, code: str) -> _Refused:
        return cls(error_response(status, message, code=code), bad_request=code)


def _pool(service: Service) -> Role:
    return "decode" if service.disaggregated else "unified"
