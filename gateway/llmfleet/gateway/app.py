"""The gateway's FastAPI app: `create_app(settings, ...)` builds everything; nothing is global.

Endpoints: POST /v1/chat/completions, POST /v1/completions (JSON or SSE), GET /v1/models,
/healthz (the process answers), /readyz (discovery has its first snapshot), /metrics, and
FastAPI's /docs and /openapi.json. Handlers read the raw body and validate only the fields the
gateway acts on (see `openai_request`), so the OpenAPI schema is attached by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import httpx
from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from llmfleet.core.loopback import LoopbackGuard, guarded
from llmfleet.gateway import openai_request
from llmfleet.gateway.aiohttp_transport import AiohttpTransport
from llmfleet.gateway.discovery import Discovery, Role, Service, StaticDiscovery
from llmfleet.gateway.endpoints import Clock, EndpointTable
from llmfleet.gateway.errors import error_response
from llmfleet.gateway.kube_discovery import KubeDiscovery, kubernetes_lister
from llmfleet.gateway.kube_secrets import read_keys_secret
from llmfleet.gateway.metrics import GatewayMetrics
from llmfleet.gateway.openai_request import InvalidRequestError, capped
from llmfleet.gateway.pd import serve_disaggregated
from llmfleet.gateway.policies.base import Handler, PolicyDeps, Stage, chain
from llmfleet.gateway.policies.cascade import Cascade
from llmfleet.gateway.policies.coalesce import Coalescer
from llmfleet.gateway.policies.debounce import Debouncer
from llmfleet.gateway.policies.priority import Admission
from llmfleet.gateway.policies.timeout import Deadline
from llmfleet.gateway.proxy import Call, Failure, Forwarder, Priority
from llmfleet.gateway.routing.base import RoutingRequest
from llmfleet.gateway.scraper import scrape_forever
from llmfleet.gateway.settings import GatewaySettings
from llmfleet.gateway.tenants import Tenants

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


def create_app(
    settings: GatewaySettings,
    *,
    discovery: Discovery | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    tenants: Tenants | None = None,
    clock: Clock = time.monotonic,
) -> FastAPI:
    """The gateway app. `discovery` defaults to the static file in the settings, `tenants` to
    its API keys file (none: no authentication); `transport` replaces the network for the
    engines (tests pass an `httpx.MockTransport`)."""
    if settings.profile not in settings.profiles:
        known = ", ".join(sorted(settings.profiles))
        raise ValueError(f"unknown routing profile {settings.profile!r} (known: {known})")
    source = discovery if discovery is not None else _discovery_from(settings)
    if tenants is None and settings.api_keys_file is not None:
        tenants = Tenants.from_file(settings.api_keys_file, clock)
    elif tenants is None and settings.api_keys_secret is not None:
        kubeconfig = str(settings.kubeconfig) if settings.kubeconfig else None
        tenants = Tenants.parse(read_keys_secret(settings.api_keys_secret, kubeconfig), clock)
    metrics = GatewayMetrics()
    table = EndpointTable(
        eject_after_failures=settings.eject_after_failures,
        eject_seconds=settings.eject_seconds,
        stale_seconds=settings.metrics_stale_seconds,
        clock=clock,
    )
    limits = httpx.Limits(
        max_connections=None,
        max_keepalive_connections=settings.keepalive_connections,
        keepalive_expiry=30,
    )
    scrape_transport = transport  # scrapes are rare: httpx's own transport unless one is given
    if transport is None and settings.upstream_client == "aiohttp":
        transport = AiohttpTransport()  # opens its session lazily, inside the running loop
    guard = LoopbackGuard(
        settings.loopback_only, lambda client: metrics.nonlocal_refused.labels(client).inc(), log
    )
    # Created here but opened lazily; closed by the lifespan.
    client = httpx.AsyncClient(
        transport=guarded(transport, guard, "upstream", limits), limits=limits, timeout=None
    )
    scrape_client = httpx.AsyncClient(
        transport=guarded(scrape_transport, guard, "scrape"),
        timeout=settings.scrape_timeout_seconds,
    )
    forwarder = Forwarder(settings, client, table, metrics)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await source.start()
        scraper = asyncio.create_task(
            scrape_forever(scrape_client, table, source, settings.scrape_interval_seconds)
        )
        try:
            yield
        finally:
            scraper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await scraper
            await source.stop()
            await client.aclose()
            await scrape_client.aclose()

    app = FastAPI(title="llmfleet gateway", version="v1", lifespan=lifespan)
    app.state.forwarder = forwarder
    app.state.table = table
    app.state.metrics = metrics

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, error: StarletteHTTPException) -> Response:
        return error_response(error.status_code, str(error.detail))

    gateway = _Gateway(settings, source, forwarder, metrics, tenants, table, clock)
    handle = gateway.handle

    @app.post(
        "/v1/chat/completions",
        openapi_extra=_body_schema(openai_request.ChatCompletionRequest),
    )
    async def chat_completions(request: Request) -> Response:
        return await handle(request, "/v1/chat/completions", chat=True)

    @app.post("/v1/completions", openapi_extra=_body_schema(openai_request.CompletionRequest))
    async def completions(request: Request) -> Response:
        return await handle(request, "/v1/completions", chat=False)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": service.namespace}
            for name, service in sorted(source.services().items())
        ]
        return {"object": "list", "data": data}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> Response:
        if not source.ready():
            return error_response(503, "discovery has no snapshot yet", code="not_ready")
        return Response(b'{"status":"ready"}', media_type="application/json")

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.exposition(), media_type="text/plain; version=0.0.4")

    return app


def _body_schema(model: type[openai_request._Common]) -> dict[str, Any]:
    schema = model.model_json_schema()
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


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

    async def handle(self, request: Request, path: str, chat: bool) -> Response:
        arrived = time.perf_counter()
        request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
        try:
            call = await self._prepare(request, request_id, path, chat, arrived)
        except _Refused as refused:
            refused.response.headers["x-request-id"] = request_id
            return refused.response
        service = call.service
        call.overhead = time.perf_counter() - arrived
        try:
            response = await _unless_client_leaves(request, self.serve(call))
        except Failure as failure:
            await _close_all(call)
            self.metrics.pool(call.labels(_pool(service))).outcome(failure.outcome).inc()
            failure.response.headers["x-request-id"] = request_id
            return failure.response
        if response is None:
            await _close_all(call)
            log.info("request_id=%s client left before the answer; cancelled", request_id)
            self.metrics.pool(call.labels(_pool(service))).outcome("cancelled").inc()
            return Response(status_code=499)  # nginx's "client closed request"; nobody reads it
        if isinstance(response, StreamingResponse):
            return _ClosingResponse(response, call)
        await _close_all(call)
        return response

    async def _prepare(
        self, request: Request, request_id: str, path: str, chat: bool, arrived: float
    ) -> Call:
        """Authenticate, parse, find the service, apply limits; _Refused says why not."""
        tenant = None
        if self.tenants is not None:
            tenant = self.tenants.identify(request.headers.get("authorization"))
            if tenant is None:
                message = "a valid API key is required (Authorization: Bearer KEY)"
                raise _Refused(error_response(401, message, code="invalid_api_key"))
        raw = await request.body()
        try:
            parsed = openai_request.parse(raw, chat=chat)
        except InvalidRequestError as error:
            raise _Refused(error_response(400, str(error), param=error.param)) from None
        service = self.source.services().get(parsed.model)
        if service is None and not self.source.ready():
            # A gateway that just started does not know the models yet: "try again", not 404.
            message = "the gateway is starting: service discovery has no snapshot yet"
            raise _Refused(
                error_response(503, message, code="not_ready", headers={"Retry-After": "1"})
            )
        if service is None:
            message = f"the model `{parsed.model}` does not exist"
            raise _Refused(error_response(404, message, code="model_not_found"))
        if tenant is not None and self.tenants is not None:
            wait = self.tenants.retry_after(tenant, parsed.tokens())
            if wait:
                labels = (service.namespace, service.name, _pool(service), service.model)
                self.metrics.pool(labels).outcome("rate_limited").inc()
                raise _Refused(
                    error_response(
                        429,
                        f"tenant {tenant.name!r} is over its requests or tokens per minute",
                        code="rate_limit_exceeded",
                        headers={"Retry-After": str(wait)},
                    )
                )
        cap = service.limits.max_tokens or self.settings.max_tokens
        body = capped(parsed, cap)
        if body is not None:
            raw = json.dumps(body).encode()
            parsed = openai_request.ParsedRequest(
                body, parsed.model, parsed.stream, cap, parsed.prompt_text
            )
        routing = RoutingRequest(
            parsed.model,
            parsed.prefix_key(self.settings.prefix_block_chars, self.settings.prefix_blocks),
            parsed.tokens(),
        )
        headers = request.headers
        return Call(
            request_id,
            service,
            parsed,
            routing,
            path,
            arrived,
            raw=raw,
            tenant=tenant.name if tenant is not None else None,
            session=_session(headers, parsed.body),
            # A tenant without a class is standard, and so its ceiling (not "no tenants").
            priority=_priority((tenant.priority or "standard") if tenant else None, headers),
            headers=headers,
        )

    async def _forward(self, call: Call) -> Response:
        """The end of the chain: the service's engines."""
        if call.service.disaggregated:
            response: Response = await serve_disaggregated(
                self.forwarder, call, call.parsed.body, call.raw
            )
            return response
        opened = await self.forwarder.open(call, call.service.pools["unified"], call.raw)
        return await self.forwarder.relay(call, opened, {})


def _session(headers: Mapping[str, str], body: Mapping[str, Any]) -> str | None:
    """Who the caller is within its tenant: `x-session-id`, else the body's `user`, else a
    digest of the API key (never the key itself: it may end up in logs); None if nothing."""
    session = headers.get("x-session-id")
    if session:
        return f"s:{session}"
    user = body.get("user")
    if isinstance(user, str) and user:
        return f"u:{user}"
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


class _ClosingResponse(Response):
    """A streamed answer that closes the call's engine streams once it is over, however it
    ended: read to the end, the client gone mid-way, or never started (the client left before
    the first byte, so the body, however the policies wrapped it, was never iterated)."""

    def __init__(self, inner: StreamingResponse, call: Call) -> None:
        self.inner = inner
        self.call = call
        self.status_code = inner.status_code
        self.background = inner.background
        self.raw_headers = inner.raw_headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.inner(scope, receive, send)
        finally:
            await _close_all(self.call)


class _Refused(Exception):
    """The request is answered by the gateway itself with `response` (4xx)."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.status_code)
        self.response = response


def _pool(service: Service) -> Role:
    return "decode" if service.disaggregated else "unified"


async def _unless_client_leaves(request: Request, work: Awaitable[Response]) -> Response | None:
    """`work`'s response, or None when the client disconnects first (then `work` is cancelled,
    which closes the upstream connection: the engine sees its client go and can abort).

    The body has been read, so the next ASGI message can only be `http.disconnect`. Once a
    streaming response is returned, starlette's StreamingResponse watches for it instead.
    """
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(request.receive())
    try:
        await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        watch.cancel()
        raise
    watch.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return None
