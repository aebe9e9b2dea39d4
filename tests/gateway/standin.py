"""A minimal OpenAI-compatible engine stand-in (a real HTTP server when run by ThreadServer).

It records every request body and can misbehave on purpose: fail with a status, answer slowly,
stream slowly (noticing when its client leaves), or play the prefill side of vLLM's NixlConnector
protocol. The simulator covers the ordinary paths; this covers what it cannot be asked to do.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


@dataclass
class StandIn:
    name: str
    status: int = 200
    """Status of every answer (a 5xx makes the gateway retry elsewhere)."""
    delay: float = 0.0
    """Seconds before answering."""
    chunk_interval: float = 0.01
    """Seconds between stream chunks."""
    chunks: int = 3
    kv_connector: bool = True
    """False: ignore `kv_transfer_params`, like an engine started without a KV connector."""
    received: list[dict[str, Any]] = field(default_factory=list)
    client_left: threading.Event = field(default_factory=threading.Event)

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/chat/completions", self._chat, methods=["POST"])])

    async def _chat(self, request: Request) -> Response:
        body = json.loads(await request.body())
        self.received.append(body)
        if await self._client_leaves_within(request, self.delay):
            self.client_left.set()
            return Response(status_code=499)
        if self.status != 200:
            error = {"message": f"{self.name} fails", "type": "x", "param": None, "code": None}
            return JSONResponse({"error": error}, status_code=self.status)
        kv = body.get("kv_transfer_params") or {}
        if (
            kv.get("do_remote_decode") and self.kv_connector
        ):  # the prefill side: keep the KV, say where it is
            params = {
                "do_remote_decode": False,
                "do_remote_prefill": True,
                "remote_engine_id": f"engine-{self.name}",
                "remote_block_ids": [1, 2, 3],
                "remote_host": "127.0.0.1",
                "remote_port": 5600,
            }
            return JSONResponse(
                _completion(self.name, "x", "length") | {"kv_transfer_params": params}
            )
        if body.get("stream"):
            return StreamingResponse(self._stream(), media_type="text/event-stream")
        return JSONResponse(_completion(self.name, f"from {self.name}", "stop"))

    @staticmethod
    async def _client_leaves_within(request: Request, seconds: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while (left := deadline - loop.time()) > 0:
            if await request.is_disconnected():
                return True
            await asyncio.sleep(min(0.02, left))
        return False

    async def _stream(self) -> AsyncIterator[bytes]:
        try:
            for i in range(self.chunks):
                chunk = {
                    "id": "c",
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": "m",
                    "choices": [{"index": 0, "delta": {"content": f"{i} "}, "finish_reason": None}],
                }
                yield f"data: {json.dumps(chunk)}\n\n".encode()
                await asyncio.sleep(self.chunk_interval)
            yield b"data: [DONE]\n\n"
        except BaseException:
            self.client_left.set()
            raise


def _completion(name: str, content: str, finish: str) -> dict[str, Any]:
    return {
        "id": f"cmpl-{name}",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": finish,
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
