"""The pod's serving port: readiness, and a pass-through to the engine that can say no.

The engine listens on 127.0.0.1 only; every client request comes through here. That is what
lets the launcher keep the pod out of traffic until warm-up has run, and refuse new work while
it drains (503 + `Retry-After`, so the gateway retries elsewhere) without touching requests
already streaming. Bodies are forwarded as bytes, responses streamed chunk by chunk.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from enum import StrEnum

import httpx
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

# Headers that describe one hop's connection, not the message (RFC 9110 §7.6.1), plus the
# framing headers the server on each side sets itself.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)


class StreamCutOffError(Exception):
    """A forwarded response was still streaming when the drain's grace period ended."""


class Phase(StrEnum):
    STARTING = "starting"
    WARMING = "warming"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"


@dataclass
class Gate:
    """Shared between the front and the supervisor: the phase, and requests being forwarded."""

    phase: Phase = Phase.STARTING
    in_flight: int = 0


def create_front(gate: Gate, client: httpx.AsyncClient) -> Starlette:
    """The front app over `client` (based at the engine's URL, owned by the caller).

    `/health/ready` (or `/ready`) is the pod's readiness probe; `/health` its liveness probe
    (the launcher is up); `/metrics` always passes through (Prometheus scrapes warm-up and drain
    too); everything else is forwarded only while ready."""

    async def ready(_: Request) -> Response:
        code = 200 if gate.phase is Phase.READY else 503
        return JSONResponse({"phase": gate.phase.value}, status_code=code)

    async def live(_: Request) -> Response:
        # While loading, the launcher being up is all liveness can say (the startup timeout
        # covers a hang there). Once serving, an engine that no longer answers its own health
        # check within 5 s (a hung GPU, a dead engine core) is a dead pod.
        if gate.phase not in (Phase.READY, Phase.DRAINING):
            return JSONResponse({"phase": gate.phase.value})
        try:
            engine = (await client.get("/health", timeout=5)).status_code
        except httpx.HTTPError:
            engine = 0
        code = 200 if engine == 200 else 503
        return JSONResponse({"phase": gate.phase.value, "engine": engine}, status_code=code)

    async def forward(request: Request) -> Response:
        if gate.phase is not Phase.READY and request.url.path != "/metrics":
            return JSONResponse(
                {"error": {"message": f"engine is {gate.phase.value}", "type": "unavailable"}},
                status_code=503,
                headers={"Retry-After": "1"},
            )
        gate.in_flight += 1
        try:
            upstream = await client.send(
                client.build_request(
                    request.method,
                    request.url.path,
                    params=str(request.query_params),
                    headers=[(k, v) for k, v in request.headers.items() if k not in _HOP_BY_HOP],
                    content=await request.body(),
                ),
                stream=True,
            )
        except httpx.HTTPError as error:
            gate.in_flight -= 1
            message = f"engine unreachable: {type(error).__name__}"
            return JSONResponse({"error": {"message": message}}, status_code=502)

        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released, gate.in_flight = True, gate.in_flight - 1

        async def finish() -> None:
            release()
            await upstream.aclose()

        async def body() -> AsyncIterator[bytes]:
            # NOTE: the count drops when the last byte is out, when the client went away
            # (Starlette stops iterating; the finally runs), or, if the client left before the
            # body started, in the background task Starlette runs after every response; once.
            try:
                async for chunk in upstream.aiter_raw():
                    if gate.phase is Phase.STOPPED:
                        # The drain's grace is over: break the connection (an exception here
                        # aborts it) so the client sees a cut stream, not a short one that ends
                        # cleanly.
                        raise StreamCutOffError(request.url.path)
                    yield chunk
            finally:
                release()

        headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP}
        return StreamingResponse(
            body(),
            status_code=upstream.status_code,
            headers=headers,
            background=BackgroundTask(finish),
        )

    methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]
    return Starlette(
        routes=[
            Route("/health/ready", ready, methods=["GET"]),
            Route("/ready", ready, methods=["GET"]),  # the operator's probe path
            Route("/health", live, methods=["GET"]),
            Route("/{path:path}", forward, methods=methods),
        ],
    )
