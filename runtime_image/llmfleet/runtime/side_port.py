"""The launcher's side port: the pod's readiness, and the drain its preStop hook starts.

The engine serves the pod's own port and every request goes to it directly; the launcher is not
on the data path. What the launcher decides is whether the pod may receive new requests: not
before warm-up has run, and not once the drain has begun. Kubernetes acts on that through the
readiness probe (`/ready`): a not-ready pod leaves its Service's EndpointSlices, so the gateway
stops sending it requests. The preStop hook (`/drain`) begins the drain and answers when the
engine has nothing left in flight, or when the grace is spent; only then does the kubelet send
SIGTERM.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


class Phase(StrEnum):
    STARTING = "starting"
    WARMING = "warming"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"


@dataclass
class Gate:
    """Shared between the side port and the supervisor: where the pod is in its life cycle."""

    phase: Phase = Phase.STARTING


Drain = Callable[[], Awaitable[int | None]]
"""Begins the drain, or joins the one under way; its result is the number of requests still in
the engine when it ended (0: drained; None: the engine never said)."""


def create_side_app(gate: Gate, drain: Drain) -> Starlette:
    """The side port's app. `GET /ready` is 200 only while the pod is ready; `GET /drain` (the
    preStop hook) is 200 once the engine is idle, 503 when the grace ended first. Nothing else is
    served: a request for the engine's API that lands here is a 404."""

    async def ready(_: Request) -> Response:
        code = 200 if gate.phase is Phase.READY else 503
        return JSONResponse({"phase": gate.phase.value}, status_code=code)

    async def begin_drain(_: Request) -> Response:
        # Shielded: the drain runs to its end even if the kubelet gives up on the hook.
        in_flight = await asyncio.shield(drain())
        code = 200 if in_flight == 0 else 503
        return JSONResponse({"phase": gate.phase.value, "inFlight": in_flight}, status_code=code)

    return Starlette(
        routes=[
            Route("/ready", ready, methods=["GET"]),
            Route("/drain", begin_drain, methods=["GET"]),
        ],
    )
