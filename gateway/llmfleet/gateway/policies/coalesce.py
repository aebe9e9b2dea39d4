"""Placeholder: the coalesce policy passes every call through (being built, issue 13)."""

from __future__ import annotations

from starlette.responses import Response

from llmfleet.gateway.policies.base import Handler, PolicyDeps
from llmfleet.gateway.proxy import Call


class Coalescer:
    def __init__(self, deps: PolicyDeps) -> None:
        self.deps = deps

    async def __call__(self, call: Call, next: Handler) -> Response:
        return await next(call)
