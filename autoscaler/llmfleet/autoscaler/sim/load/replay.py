"""The open-loop sender: planned requests go out at their times, whatever the answers do.

Each request is a streamed `/v1/completions` call (`stream_options.include_usage`, so the last
chunk says how many tokens the engine counted) with `max_tokens` = the trace's output length
and vLLM's `ignore_eos`, so the engine generates that many tokens instead of stopping early.

The concurrency cap drops, it does not wait: a request due while `concurrency` requests are in
flight is not sent and counts as `dropped: concurrency cap`. Waiting for a free slot would
turn the replay into a closed loop that slows down with the service and hides the overload it
should measure (coordinated omission); a drop keeps every other send on time and shows the
shortfall. The cap exists to protect this client (sockets, CPU), not to shape the load.

Error kinds: `http STATUS TYPE` (the gateway's OpenAI error `type`, if its body has one),
`stream error: TYPE` (an error event in the middle of a stream), `timeout` (no bytes for the
timeout), `connection` (cannot connect, or the connection broke), `stream cut` (the answer
ended without `[DONE]`), `bad stream` (a chunk that is not JSON), `empty answer` (a stream
with no text at all).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from llmfleet.autoscaler.sim.load.plan import PlannedRequest, PromptBuilder
from llmfleet.autoscaler.sim.load.stats import DROPPED, Outcome

Clock = Callable[[], float]
Send = Callable[[PlannedRequest, float], Awaitable[Outcome]]
"""Sends one planned request; the float is when it left, seconds after the replay started."""


@dataclass
class Tally:
    """Running counts, for progress displays (updated as requests go and come back)."""

    planned: int
    sent: int = 0
    ok: int = 0
    failed: int = 0
    dropped: int = 0
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def in_flight(self) -> int:
        return self.sent - self.ok - self.failed

    @property
    def done(self) -> int:
        return self.ok + self.failed + self.dropped

    def record(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)
        if outcome.sent_s is None:
            self.dropped += 1
        elif outcome.ok:
            self.ok += 1
        else:
            self.failed += 1


async def replay(
    planned: list[PlannedRequest],
    send: Send,
    *,
    concurrency: int | None,
    tally: Tally | None = None,
    clock: Clock = time.monotonic,
) -> tuple[list[Outcome], float]:
    """Every outcome, in trace order, and the seconds from the start to the last answer."""
    tally = tally if tally is not None else Tally(len(planned))
    start = clock()
    tasks: list[asyncio.Task[None]] = []

    async def run(request: PlannedRequest, sent_s: float) -> None:
        try:
            outcome = await send(request, sent_s)
        except Exception as error:  # a bug in one send must not stop the replay
            outcome = _failed(request, sent_s, f"client error: {type(error).__name__}")
        tally.record(outcome)

    for request in planned:
        delay = start + request.send_at - clock()
        if delay > 0:
            await asyncio.sleep(delay)
        if concurrency is not None and tally.in_flight >= concurrency:
            tally.record(
                Outcome(
                    request.index,
                    request.send_at,
                    None,
                    DROPPED,
                    prompt_tokens=request.prompt_tokens,
                )
            )
            continue
        tally.sent += 1
        tasks.append(asyncio.create_task(run(request, clock() - start)))
    await asyncio.gather(*tasks)
    return sorted(tally.outcomes, key=lambda o: o.index), clock() - start


def _failed(request: PlannedRequest, sent_s: float, kind: str) -> Outcome:
    return Outcome(
        request.index, request.send_at, sent_s, kind, prompt_tokens=request.prompt_tokens
    )


def request_body(model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def http_error_kind(status: int, body: bytes) -> str:
    """`http STATUS TYPE`, TYPE from an OpenAI error body (`{"error": {"type": …}}`)."""
    kind = f"http {status}"
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return kind
    if isinstance(error, dict) and isinstance(error.get("type"), str):
        return f"{kind} {error['type']}"
    return kind


def parse_event(data: str) -> dict[str, Any] | str:
    """A stream chunk's JSON object, or the error kind it amounts to."""
    try:
        event = json.loads(data)
    except ValueError:
        return "bad stream"
    if not isinstance(event, dict):
        return "bad stream"
    if "error" in event:
        error = event["error"]
        named = error.get("type") if isinstance(error, dict) else None
        return f"stream error: {named or 'unknown'}"
    return event


class OpenAISender:
    """Streams one planned request through `client` (its base URL: the gateway)."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        model: str,
        prompts: PromptBuilder,
        clock: Clock = time.monotonic,
    ) -> None:
        self.client = client
        self.model = model
        self.prompts = prompts
        self.clock = clock

    async def __call__(self, request: PlannedRequest, sent_s: float) -> Outcome:
        body = request_body(self.model, self.prompts.prompt(request), request.max_tokens)
        try:
            return await self._stream(request, sent_s, body)
        except httpx.TimeoutException:
            return _failed(request, sent_s, "timeout")
        except httpx.TransportError:
            return _failed(request, sent_s, "connection")

    async def _stream(
        self, request: PlannedRequest, sent_s: float, body: dict[str, Any]
    ) -> Outcome:
        began = self.clock()
        first: float | None = None
        last = began
        gaps: list[float] = []
        usage: dict[str, Any] = {}
        async with self.client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                kind = http_error_kind(response.status_code, await response.aread())
                return _failed(request, sent_s, kind)
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue  # blank separators, SSE comments
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                event = parse_event(data)
                if isinstance(event, str):
                    return _failed(request, sent_s, event)
                if event.get("usage"):
                    usage = event["usage"]
                if any(choice.get("text") for choice in event.get("choices") or ()):
                    now = self.clock()
                    if first is None:
                        first = now
                    else:
                        gaps.append(now - last)
                    last = now
            else:
                return _failed(request, sent_s, "stream cut")
        if first is None:
            return _failed(request, sent_s, "empty answer")
        counted = usage.get("prompt_tokens")
        return Outcome(
            request.index,
            request.send_at,
            sent_s,
            ttft_s=first - began,
            gaps_s=tuple(gaps),
            output_tokens=int(usage.get("completion_tokens", len(gaps) + 1)),
            prompt_tokens=request.prompt_tokens,
            prompt_tokens_counted=int(counted) if isinstance(counted, int) else None,
        )


async def served_models(client: httpx.AsyncClient) -> list[str]:
    """The model names `/v1/models` lists, in its order."""
    response = await client.get("/v1/models")
    response.raise_for_status()
    return [str(item["id"]) for item in response.json().get("data", [])]
