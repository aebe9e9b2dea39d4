"""The warm-up sends a request again after an error a busy or briefly broken engine gives (429,
5xx), `ATTEMPTS` times at most, and fails at once on any other error: against a real HTTP server
on 127.0.0.1 that answers each chat request with the next status of a script."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from llmfleet.runtime.config import Warmup
from llmfleet.runtime.errors import ExitCode, LauncherError
from llmfleet.runtime.warmup import ATTEMPTS, run_warmup
from tests.gateway.servers import ThreadServer

SERVED = "served"


def scripted_engine(statuses: list[int], seen: list[int]) -> Starlette:
    """An engine whose n-th chat request gets `statuses[n]` (200 once the script ends)."""

    async def models(_: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": SERVED, "object": "model"}]})

    async def chat(request: Request) -> Response:
        await request.body()
        status = statuses[len(seen)] if len(seen) < len(statuses) else 200
        seen.append(status)
        body = {"choices": [{"message": {"content": "ok"}}]} if status == 200 else {
            "error": {"message": f"scripted {status}"}}  # fmt: skip
        return JSONResponse(body, status_code=status)

    return Starlette(routes=[Route("/v1/models", models),
                             Route("/v1/chat/completions", chat, methods=["POST"])])  # fmt: skip


@dataclass(frozen=True)
class Case:
    id: str
    statuses: list[int]
    passes: bool
    chat_requests: int
    """How many chat requests the engine saw (two warm-up bodies)."""
    words: str = ""


CASES = [
    Case("all-fine", [], True, 2),
    Case("two-503-then-fine", [503, 503], True, 4),
    Case("429-then-fine", [429], True, 3),
    Case("second-body-500-once", [200, 500], True, 3),
    Case("always-500", [500] * ATTEMPTS, False, ATTEMPTS,
         f"warm-up request 1/2 got HTTP 500: {{\"error\":{{\"message\":\"scripted 500\"}}}} "
         f"({ATTEMPTS} attempts)"),
    Case("400-fails-at-once", [400], False, 1, "warm-up request 1/2 got HTTP 400"),
    Case("404-after-a-503", [503, 404], False, 2, "warm-up request 1/2 got HTTP 404"),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_warmup_retries_what_an_engine_may_get_over(case: Case) -> None:
    seen: list[int] = []
    with ThreadServer(scripted_engine(case.statuses, seen)) as engine:

        async def warm() -> int:
            async with httpx.AsyncClient(base_url=engine.url, trust_env=False) as client:
                return await run_warmup(client, SERVED, Warmup(requests=2), pause=0.01)

        if case.passes:
            assert asyncio.run(warm()) == 1 + case.chat_requests  # /v1/models and each chat
        else:
            with pytest.raises(LauncherError) as failed:
                asyncio.run(warm())
            assert failed.value.code == ExitCode.WARMUP_FAILED
            assert case.words in str(failed.value)
    assert len(seen) == case.chat_requests
