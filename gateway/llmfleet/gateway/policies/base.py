"""What every traffic policy stage shares: the handler type, the stage protocol, the chain."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from starlette.responses import Response

from llmfleet.gateway.discovery import Discovery
from llmfleet.gateway.endpoints import Clock, EndpointTable
from llmfleet.gateway.metrics import GatewayMetrics
from llmfleet.gateway.proxy import Call, Forwarder
from llmfleet.gateway.settings import GatewaySettings

Handler = Callable[[Call], Awaitable[Response]]
"""Serves a call: the rest of the chain after a stage, down to the engines. It returns the
client's response (a `StreamingResponse` whose body is still to come, for streams) or raises
`proxy.Failure` with the OpenAI-shaped error to send instead."""


@dataclass(frozen=True)
class PolicyDeps:
    """Everything a stage may need; every stage is built as `Stage(deps)`."""

    settings: GatewaySettings
    metrics: GatewayMetrics
    discovery: Discovery
    table: EndpointTable
    """Per-endpoint scraped load and in-flight counts (read-only for stages)."""
    forwarder: Forwarder
    serve: Handler
    """The terminal handler (the engines), for stages that call other services' pools
    directly (cascade hedging) rather than through the rest of the chain."""
    clock: Clock = field(default=time.monotonic)


class Stage(Protocol):
    def __call__(self, call: Call, next: Handler) -> Awaitable[Response]:
        """Answer `call`, usually by awaiting `next(call)` (possibly with another call)."""
        ...


def chain(stages: Sequence[Stage], last: Handler) -> Handler:
    """One handler running `stages` in order (the first outermost), then `last`."""
    handler = last
    for stage in reversed(stages):
        handler = _bind(stage, handler)
    return handler


def _bind(stage: Stage, next_handler: Handler) -> Handler:
    def handle(call: Call) -> Awaitable[Response]:
        return stage(call, next_handler)

    return handle
