"""An OpenAI-compatible engine stand-in whose token logprobs the test sets (a real HTTP server
when run by ThreadServer), for the cascade tests.

Why not the simulator: llm-d-inference-sim (v0.10.2) does return logprobs when asked (chat
`logprobs: true`, completions `logprobs: N`, streamed or not), but fixed ones: the tokens cycle
through -1.0, -1.1, -1.2, so every answer's mean token probability is about 0.33 and nothing
makes it confident or not on demand. This engine answers `tokens` tokens, each with
probability `probability` (logprob ln p), only when asked for logprobs, as real engines do.

It counts the requests it gets (`received`), notices a client that leaves (`client_left`) and
says when a stream has produced every token (`finished`, set before `[DONE]` is sent).
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


@dataclass
class LogprobEngine:
    name: str
    probability: float = 0.9
    """Probability of every token it answers (its logprob is ln of it)."""
    tokens: int = 4
    delay: float = 0.0
    """Seconds before the answer's headers (a client leaving meanwhile is noticed)."""
    token_interval: float = 0.0
    """Seconds between streamed tokens."""
    status: int = 200
    received: list[dict[str, Any]] = field(default_factory=list)
    client_left: threading.Event = field(default_factory=threading.Event)
    finished: threading.Event = field(default_factory=threading.Event)

    def reset(self, **settings: Any) -> None:
        """Back to the defaults, with `settings` changed; counts and events cleared."""
        fresh = LogprobEngine(self.name, **settings)
        for name in ("probability", "tokens", "delay", "token_interval", "status"):
            setattr(self, name, getattr(fresh, name))
        self.received.clear()
        self.client_left.clear()
        self.finished.clear()

    def words(self) -> list[str]:
        """The tokens of every answer: `<name>0 `, `<name>1 `, ..."""
        return [f"{self.name}{i} " for i in range(self.tokens)]

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self._answer, methods=["POST"]),
                Route("/v1/completions", self._answer, methods=["POST"]),
            ]
        )

    async def _answer(self, request: Request) -> Response:
        body = json.loads(await request.body())
        self.received.append(body)
        chat = request.url.path.endswith("/chat/completions")
        if await _client_leaves_within(request, self.delay):
            self.client_left.set()
            return Response(status_code=499)
        if self.status != 200:
            error = {"message": f"{self.name} fails", "type": "x", "param": None, "code": None}
            return JSONResponse({"error": error}, status_code=self.status)
        logprobs = body.get("logprobs") not in (None, False)
        if body.get("stream"):
            return StreamingResponse(self._stream(chat, logprobs), media_type="text/event-stream")
        return JSONResponse(self._whole(chat, logprobs))

    def _whole(self, chat: bool, logprobs: bool) -> dict[str, Any]:
        words = self.words()
        text = "".join(words)
        choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        choice["logprobs"] = self._logprobs(words, chat) if logprobs else None
        usage = {"prompt_tokens": 3, "completion_tokens": len(words)}
        return {
            "id": f"cmpl-{self.name}",
            "object": "chat.completion" if chat else "text_completion",
            "created": 0,
            "model": self.name,
            "choices": [choice],
            "usage": usage | {"total_tokens": 3 + len(words)},
        }

    def _logprobs(self, words: list[str], chat: bool) -> dict[str, Any]:
        value = math.log(self.probability)
        if chat:
            return {
                "content": [
                    {"token": w, "logprob": value, "bytes": None, "top_logprobs": []} for w in words
                ]
            }
        return {
            "tokens": words,
            "token_logprobs": [value] * len(words),
            "top_logprobs": None,
            "text_offset": [sum(len(w) for w in words[:i]) for i in range(len(words))],
        }

    async def _stream(self, chat: bool, logprobs: bool) -> AsyncIterator[bytes]:
        kind = "chat.completion.chunk" if chat else "text_completion"
        head = {"id": f"cmpl-{self.name}", "object": kind, "created": 0, "model": self.name}
        try:
            if chat:
                role = {"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}
                yield _event(head | {"choices": [role]})
            for word in self.words():
                choice: dict[str, Any] = {"index": 0, "finish_reason": None}
                if chat:
                    choice["delta"] = {"content": word}
                else:
                    choice["text"] = word
                if logprobs:
                    choice["logprobs"] = self._logprobs([word], chat)
                yield _event(head | {"choices": [choice]})
                await asyncio.sleep(self.token_interval)
            last: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
            last |= {"delta": {}} if chat else {"text": ""}
            yield _event(head | {"choices": [last]})
            self.finished.set()
            yield b"data: [DONE]\n\n"
        except BaseException:
            self.client_left.set()
            raise


def _event(value: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(value)}\n\n".encode()


async def _client_leaves_within(request: Request, seconds: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while (left := deadline - loop.time()) > 0:
        if await request.is_disconnected():
            return True
        await asyncio.sleep(min(0.02, left))
    return False
