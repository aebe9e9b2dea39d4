"""Warm-up: the requests an engine serves before its pod is ready.

First request paths are slow in every engine (lazy kernel selection, first sampler and detokenizer
calls, allocator growth); the service's system prompts are sent so their KV blocks sit in the
prefix cache before the first user shares them. One request streams, so the SSE path is warm too.
The launcher sends them to the engine on 127.0.0.1 before the pod is ready, so no client has
found the engine yet.
"""

from __future__ import annotations

from typing import Any

import httpx

from llmfleet.runtime.config import Warmup
from llmfleet.runtime.errors import ExitCode, LauncherError

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


async def run_warmup(client: httpx.AsyncClient, served_name: str, warmup: Warmup) -> int:
    """Send the warm-up; returns how many requests it made. Any failure is WARMUP_FAILED."""
    await check_served(client, served_name)
    bodies = warmup_requests(served_name, warmup)
    for number, body in enumerate(bodies, start=1):
        try:
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                content = await response.aread()
        except httpx.HTTPError as error:
            raise LauncherError(
                ExitCode.WARMUP_FAILED,
                f"warm-up request {number}/{len(bodies)} failed: {type(error).__name__}",
            ) from None
        if response.status_code != 200:
            excerpt = content[:160].decode(errors="replace").replace("\n", " ")
            raise LauncherError(
                ExitCode.WARMUP_FAILED,
                f"warm-up request {number}/{len(bodies)} "
                f"got HTTP {response.status_code}: {excerpt}",
            )
    return len(bodies) + 1
