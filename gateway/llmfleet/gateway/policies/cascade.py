"""Model cascading (`spec.traffic.cascade`): cheaper services answer first, this one when they
are not sure.

Contracts:
- The tiers (other InferenceServices of the namespace, cheapest first) are chosen by the
  heuristics of `cascade_plan`; each asked tier gets the caller's body with its own `model` and
  logprobs on (chat `logprobs: true`, completions `logprobs: 1`), through the rest of the chain,
  so a P/D tier works as any other.
- A tier's answer is judged whole (`confidence`): below its `escalateBelowConfidence` it is
  discarded and the next tier is asked; a tier that fails (an error, or any status but 200) is
  passed over the same way. A stream from a tier is buffered until the decision, then replayed.
- The service itself answers last, with the caller's body unchanged, relayed as it comes.
- Hedged (a hard request, `hedge: true`): the first tier and the service are asked at once.
  The cheap answer wins when it is confident; a non-streamed answer of the service that arrives
  before the cheap one is judged wins at once. The loser is cancelled: its upstream connection
  is closed, so its engine sees its client leave.
- Every response (and error) says `x-llmfleet-tier: <service that answered>` and
  `x-llmfleet-escalated: true|false` (true when a tier's answer was discarded before it). A
  tier's logprobs reach the caller only if the caller asked for them (else they are `null`).
- One log line per cascaded request: its id, the tier that answered, the confidence of each
  tier asked and the tiers skipped.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Iterable
from dataclasses import dataclass, field
from typing import Any

from starlette.responses import Response, StreamingResponse

from llmfleet.crds.policy import CascadeSpec, CascadeTier
from llmfleet.gateway.discovery import Service
from llmfleet.gateway.policies.base import Handler, PolicyDeps
from llmfleet.gateway.policies.cascade_plan import hint_text, plan, prompt_tokens
from llmfleet.gateway.policies.confidence import answer_logprobs, confidence
from llmfleet.gateway.proxy import Call, Failure

log = logging.getLogger("llmfleet.gateway.policies")

CHAT = "/v1/chat/completions"
_DROPPED_HEADERS = frozenset({"content-length", "content-type"})
"""Headers of a tier's response not carried to a rebuilt one (its body and type are new)."""


@dataclass
class _Answer:
    """A tier's judged answer."""

    tier: str
    response: Response | None
    """None when the tier failed."""
    confidence: float = 0.0
    confident: bool = False
    events: list[str] = field(default_factory=list)
    """A streamed answer: its SSE text split into lines (buffered until the decision)."""
    payload: dict[str, Any] | None = None
    """A non-streamed answer: its JSON body."""

    def note(self) -> str:
        if self.response is None:
            return f"{self.tier}:failed"
        return f"{self.tier}:{self.confidence:.3f}"


@dataclass
class _Cascaded:
    """One request on its way through the tiers, and what its log line will say."""

    call: Call
    next: Handler
    spec: CascadeSpec
    asked: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    hedged: bool = False


class Cascade:
    def __init__(self, deps: PolicyDeps) -> None:
        self.deps = deps
        self.metrics = deps.metrics.policies

    async def __call__(self, call: Call, next: Handler) -> Response:
        spec = call.service.traffic.cascade
        if not spec.tiers:
            return await next(call)
        namespace = call.service.namespace
        services = {
            t.service: self.deps.discovery.by_name(namespace, t.service) for t in spec.tiers
        }
        decided = plan(
            spec,
            prompt_tokens=prompt_tokens(call.parsed.prompt_text),
            text=hint_text(call.parsed.body, call.parsed.prompt_text),
            tier_header=call.headers.get("x-llmfleet-tier"),
            known=lambda name: services.get(name) is not None,
        )
        r = _Cascaded(call, next, spec, skipped=[f"{t}:{why}" for t, why in decided.skipped])
        for tier_name, reason in decided.skipped:
            self.metrics.cascade_skipped.labels(*call.policy_labels(), tier_name, reason).inc()
        tiers = [(t, s) for t in decided.tiers if (s := services.get(t.service)) is not None]
        if decided.hedge and tiers:
            return await self._hedged(r, *tiers[0])
        escalated = False
        for tier, service in tiers:
            answer = await self._ask(r, tier, service)
            if answer.confident:
                return self._served(r, answer, escalated)
            escalated = True
        return self._own(r, await self._mark_failure(r, next(call), escalated), escalated)

    async def _ask(self, r: _Cascaded, tier: CascadeTier, service: Service) -> _Answer:
        """`tier`'s answer, read whole and judged; escalation counted when it is not kept."""
        call = r.call
        body = dict(call.parsed.body)
        body["model"] = service.model
        if not _asks_logprobs(call.parsed.body):
            body["logprobs"] = True if call.path == CHAT else 1
        answer = await _read(tier.service, r.next, call.retarget(service, body))
        labels = call.policy_labels()
        if answer.response is not None:
            found = answer_logprobs(_answers(answer))
            answer.confidence = confidence(r.spec.confidence, found, r.spec.window_tokens)
            answer.confident = answer.confidence >= tier.escalate_below_confidence
            self.metrics.cascade_confidence.labels(*labels, tier.service).observe(answer.confidence)
        r.asked.append(answer.note())
        if not answer.confident:
            reason = "tier_failed" if answer.response is None else "low_confidence"
            self.metrics.cascade_escalations.labels(*labels, tier.service, reason).inc()
        return answer

    async def _hedged(self, r: _Cascaded, tier: CascadeTier, service: Service) -> Response:
        r.hedged = True
        cheap = asyncio.ensure_future(self._ask(r, tier, service))
        large = asyncio.ensure_future(r.next(r.call))
        labels = r.call.policy_labels()
        try:
            await asyncio.wait((cheap, large), return_when=asyncio.FIRST_COMPLETED)
            # NOTE: a streamed answer of the service "completes" when its headers arrive, long
            # before it is whole: only a non-streamed one can win the race outright.
            if not r.call.parsed.stream and not cheap.done() and _answered(large):
                await _cancel(cheap)
                r.asked.append(f"{tier.service}:cancelled")
                self.metrics.cascade_hedged.labels(*labels, "large").inc()
                return self._own(r, large.result(), False)
            answer = await cheap
            if answer.confident:
                await _cancel(large)
                self.metrics.cascade_hedged.labels(*labels, "cheap").inc()
                return self._served(r, answer, False)
            self.metrics.cascade_hedged.labels(*labels, "large").inc()
            return self._own(r, await self._mark_failure(r, large, True), True)
        except BaseException:
            await _cancel(cheap)
            await _cancel(large)
            raise

    async def _mark_failure(
        self, r: _Cascaded, work: Awaitable[Response], escalated: bool
    ) -> Response:
        """The service's own response; its failure carries the cascade headers too."""
        try:
            return await work
        except Failure as failure:
            _mark(failure.response, r.call.service.name, escalated)
            self._log(r, r.call.service.name, escalated, outcome=failure.outcome)
            raise

    def _own(self, r: _Cascaded, response: Response, escalated: bool) -> Response:
        """The service's own answer, as it comes."""
        _mark(response, r.call.service.name, escalated)
        self._count(r, r.call.service.name, escalated)
        self._log(r, r.call.service.name, escalated)
        return response

    def _served(self, r: _Cascaded, answer: _Answer, escalated: bool) -> Response:
        """A tier's kept answer, its logprobs stripped unless the caller asked for them."""
        original = answer.response
        assert original is not None
        keep = _asks_logprobs(r.call.parsed.body)
        headers = {k: v for k, v in original.headers.items() if k not in _DROPPED_HEADERS}
        response: Response
        if answer.payload is None:  # streamed: replay the buffered events
            lines = answer.events if keep else [_strip_line(line) for line in answer.events]
            response = StreamingResponse(
                _replay(lines), 200, headers, media_type="text/event-stream"
            )
        elif keep:
            response = original
        else:
            for choice in _choices(answer.payload):
                choice["logprobs"] = None
            body = json.dumps(answer.payload, separators=(",", ":")).encode()
            response = Response(body, 200, headers, media_type="application/json")
        _mark(response, answer.tier, escalated)
        self._count(r, answer.tier, escalated)
        self._log(r, answer.tier, escalated)
        return response

    def _count(self, r: _Cascaded, tier: str, escalated: bool) -> None:
        labels = r.call.policy_labels()
        self.metrics.cascade_served.labels(*labels, tier, _flag(escalated)).inc()

    @staticmethod
    def _log(r: _Cascaded, tier: str, escalated: bool, outcome: str = "served") -> None:
        log.info(
            "request_id=%s cascade %s tier=%s escalated=%s confidence=%s skipped=%s hedged=%s",
            r.call.request_id,
            outcome,
            tier,
            _flag(escalated),
            ",".join(r.asked) or "-",
            ",".join(r.skipped) or "-",
            _flag(r.hedged),
        )


async def _read(tier: str, next: Handler, call: Call) -> _Answer:
    """Ask a tier and read its answer whole (a stream is buffered to its end)."""
    try:
        response = await next(call)
    except Failure:
        return _Answer(tier, None)
    if response.status_code != 200:
        await _discard(response)
        return _Answer(tier, None)
    if isinstance(response, StreamingResponse):
        chunks = [_bytes(chunk) async for chunk in response.body_iterator]
        lines = b"".join(chunks).decode("utf-8", "replace").split("\n")
        if any("error" in event for event in _events(lines)):
            return _Answer(tier, None)  # the forwarder's mid-stream error event
        return _Answer(tier, response, events=lines)
    try:
        payload = json.loads(bytes(response.body))
    except ValueError:
        payload = None
    if not isinstance(payload, dict):
        return _Answer(tier, None)
    return _Answer(tier, response, payload=payload)


def _answers(answer: _Answer) -> Iterable[dict[str, Any]]:
    return [answer.payload] if answer.payload is not None else _events(answer.events)


def _events(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The JSON objects of an SSE stream's `data:` lines (not `[DONE]`)."""
    found = []
    for line in lines:
        value = _data(line)
        if isinstance(value, dict):
            found.append(value)
    return found


def _data(line: str) -> Any:
    if not line.startswith("data:"):
        return None
    payload = line[5:].strip()
    if payload == "[DONE]":
        return None
    try:
        return json.loads(payload)
    except ValueError:
        return None


def _strip_line(line: str) -> str:
    value = _data(line)
    if not isinstance(value, dict) or not _choices(value):
        return line
    for choice in _choices(value):
        choice["logprobs"] = None
    return (
        "data: " + json.dumps(value, separators=(",", ":")) + ("\r" if line.endswith("\r") else "")
    )


def _choices(payload: dict[str, Any]) -> list[dict[str, Any]]:
    choices = payload.get("choices")
    if not isinstance(choices, list):
        return []
    return [choice for choice in choices if isinstance(choice, dict)]


async def _replay(lines: list[str]) -> AsyncIterator[bytes]:
    """The buffered stream again, one SSE event a chunk."""
    text = "\n".join(lines)
    events = text.split("\n\n")
    for i, event in enumerate(events):
        last = i == len(events) - 1
        if event or not last:
            yield (event if last else event + "\n\n").encode()


def _asks_logprobs(body: dict[str, Any]) -> bool:
    """Chat `logprobs: true`, completions `logprobs: N` (0 included)."""
    value = body.get("logprobs")
    return value is not None and value is not False


def _mark(response: Response, tier: str, escalated: bool) -> None:
    response.headers["x-llmfleet-tier"] = tier
    response.headers["x-llmfleet-escalated"] = _flag(escalated)


def _flag(value: bool) -> str:
    return "true" if value else "false"


def _bytes(chunk: str | bytes | memoryview) -> bytes:
    return chunk.encode() if isinstance(chunk, str) else bytes(chunk)


def _answered(task: asyncio.Future[Response]) -> bool:
    """The service's task ended with an answer worth sending (not an error, not a 5xx)."""
    if not task.done() or task.cancelled() or task.exception() is not None:
        return False
    return task.result().status_code < 500


async def _cancel(task: asyncio.Future[Any]) -> None:
    """Stop a loser: cancel it if it runs, close its response if it already has one."""
    if not task.done():
        task.cancel()
        await asyncio.wait((task,))  # not `await task`: our own cancellation must still raise
    if task.cancelled():
        return
    if task.exception() is not None:  # retrieved, so asyncio does not warn about it
        return
    result = task.result()
    if isinstance(result, Response):
        await _discard(result)


async def _discard(response: Response) -> None:
    """Close a streaming response nobody will send: its upstream connection closes, so its
    engine sees the client leave now rather than when the caller's response is over (the
    relay's `aclose()` works before its first chunk too)."""
    if isinstance(response, StreamingResponse):
        close = getattr(response.body_iterator, "aclose", None)
        if close is not None:
            await close()
