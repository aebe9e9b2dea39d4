"""Warm-up: the requests an engine serves before its pod is ready.

First request paths are slow in every engine (lazy kernel selection, first sampler and detokenizer
calls, allocator growth); the service's system prompts are sent so their KV blocks sit in the
prefix cache before the first user shares them. One request streams, so the SSE path is warm too.
The launcher sends them to the engine on 127.0.0.1 before the pod is ready, so no client has
found the engine yet.

A request that fails the way a busy or briefly broken engine fails (a transport error, HTTP 429
or 5xx) is sent again, `ATTEMPTS` times at most with a growing pause, within the warm-up's time
budget: one transient error must not crash-loop the pod (a canary whose engine fails some
requests must come up, or its analysis never sees the error rate). Any other answer (a 4xx: the
request itself is wrong for this engine) fails at once.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx

from llmfleet.runtime.config import Warmup
from llmfleet.runtime.errors import ExitCode, LauncherError

log = logging.getLogger("llmfleet.runtime")

ATTEMPTS = 5
"""How many times one warm-up request is sent before the warm-up fails."""
FIRST_PAUSE_SECONDS = 0.5
"""The pause before the second attempt; each later pause doubles."""

# Each warm-up prompt asks for a short reply; the text only needs to be tokenizable.
_USER_TURN = "Reply with one short sentence: are you ready?"


def warmup_requests(served_name: str, warmup: Warmup) -> list[dict[str, Any]]:
    """The chat-completion bodies of a warm-up, in order (pure)."""
    bodies: list[dict[str, Any]] = []
    for prompt in warmup.system_prompts:
        messages = [{"role": "system", "content": prompt}, {"role": "user", "content": _USER_TURN}]
        bodies.append({"model": served_name, "messages": messages, "max_tokens": warmup.max_tokens})
    for index in range(warmup.requests):
        messages = [{"role": "user", "content": f"{_USER_TURN} ({index + 1})"}]
        bodies.append(
            {
                "model": served_name,
                "messages": messages,
                "max_tokens": warmup.max_tokens,
                "stream": index == 0,
            }
        )
    return bodies


async def check_served(client: httpx.AsyncClient, served_name: str) -> None:
    """The engine lists the served name in /v1/models (else every client request would 404)."""
    response = await client.get("/v1/models")
    if response.status_code != 200:
        raise LauncherError(
            ExitCode.WARMUP_FAILED, f"warm-up: GET /v1/models answered HTTP {response.status_code}"
        )
    served = [model.get("id") for model in response.json().get("data", [])]
    if served_name not in served:
        raise LauncherError(
            ExitCode.WARMUP_FAILED,
            f"warm-up: the engine serves {served}, not {served_name!r}",
        )


def _retryable(status: int) -> bool:
    return status == 429 or status >= 500


async def run_warmup(
    client: httpx.AsyncClient, served_name: str, warmup: Warmup, pause: float = FIRST_PAUSE_SECONDS
) -> int:
    """Send the warm-up; returns how many requests it made. A request still failing after
    `ATTEMPTS` tries, or failing with a 4xx, is WARMUP_FAILED."""
    await check_served(client, served_name)
    bodies = warmup_requests(served_name, warmup)
    made = 1
    for number, body in enumerate(bodies, start=1):
        for attempt in range(1, ATTEMPTS + 1):
            made += 1
            failure = await _send(client, body)
            if failure is None:
                break
            what = f"warm-up request {number}/{len(bodies)} {failure[1]}"
            if not failure[0] or attempt == ATTEMPTS:
                tries = f" ({attempt} attempts)" if attempt > 1 else ""
                raise LauncherError(ExitCode.WARMUP_FAILED, what + tries)
            wait = pause * 2 ** (attempt - 1)
            log.warning("%s; trying again in %.1fs (attempt %d of %d)",
                        what, wait, attempt + 1, ATTEMPTS)  # fmt: skip
            await asyncio.sleep(wait)
    return made


async def _send(client: httpx.AsyncClient, body: dict[str, Any]) -> tuple[bool, str] | None:
    """None when the engine answered 200; else whether to try again, and what happened."""
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            content = await response.aread()
    except httpx.HTTPError as error:
        return True, f"failed: {type(error).__name__}"
    if response.status_code == 200:
        return None
    excerpt = content[:160].decode(errors="replace").replace("\n", " ")
    return _retryable(response.status_code), f"got HTTP {response.status_code}: {excerpt}"
