"""An engine stand-in that knows who talks to it: run under the launcher as its engine command.

    python -m tests.runtime.engine_standin --host H --port P --model M --name prefill

It serves what the launcher and the gateway need of vLLM (`/health`, `/v1/models`, `/metrics`
with the running-requests gauge, `POST /v1/chat/completions`, plain or streamed, and the prefill
side of the NixlConnector hand-off), and records for every completion request the process on
the other end of its connection, found by the connection's address in the kernel's socket
table, and when it sent the answer's last byte. `GET /seen` returns the records. That is how a
test tells a request that came straight from the gateway from one a proxy in the pod passed on,
and whether a drain waited for the engine. Like vLLM under the launcher (`--shutdown-timeout 0`)
it exits at once on SIGTERM, cutting off whatever is still in flight.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from types import FrameType
from typing import Any

import psutil
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route


@dataclass
class Seen:
    path: str
    peer_pid: int | None
    """The process whose socket sent the request (None: not found in the socket table)."""
    kv_transfer_params: dict[str, Any] | None
    stream: bool
    finished_at: float | None = None
    """`time.monotonic()` (the same clock in every process) when the answer's last byte went."""


def peer_pid(host: str, port: int) -> int | None:
    """The process holding the local end `host:port` of a TCP connection on this machine."""
    for connection in psutil.net_connections(kind="tcp"):
        if connection.laddr and tuple(connection.laddr) == (host, port) and connection.pid:
            return connection.pid
    return None


def create_app(model: str, name: str, token_seconds: float) -> Starlette:
    seen: list[Seen] = []
    running = 0

    async def health(_: Request) -> Response:
        return JSONResponse({})

    async def models(_: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": model, "object": "model"}]})

    async def metrics(_: Request) -> Response:
        labels = f'{{model_name="{model}"}}'
        text = f"vllm:num_requests_running{labels} {running}\nvllm:num_requests_waiting{labels} 0\n"
        return PlainTextResponse(text)

    async def report(_: Request) -> Response:
        return JSONResponse([asdict(record) for record in seen])

    async def chat(request: Request) -> Response:
        nonlocal running
        body = json.loads(await request.body())
        client = request.client
        pid = peer_pid(client.host, client.port) if client else None
        kv = body.get("kv_transfer_params")
        record = Seen(request.url.path, pid, kv, bool(body.get("stream")))
        seen.append(record)
        running += 1
        if not record.stream:
            try:
                answer = _completion(name, model, kv)
            finally:
                running -= 1
                record.finished_at = time.monotonic()
            return JSONResponse(answer)

        async def chunks() -> AsyncIterator[bytes]:
            nonlocal running
            try:
                for index in range(int(body.get("max_tokens") or 4)):
                    yield _chunk(model, f"{index} ")
                    await asyncio.sleep(token_seconds)
                yield b"data: [DONE]\n\n"
            finally:
                running -= 1
                record.finished_at = time.monotonic()

        return StreamingResponse(chunks(), media_type="text/event-stream")

    return Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/seen", report, methods=["GET"]),
            Route("/v1/chat/completions", chat, methods=["POST"]),
        ]
    )


def _completion(name: str, model: str, kv: dict[str, Any] | None) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "id": f"cmpl-{name}",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "x"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
    if kv and kv.get("do_remote_decode"):
        # The prefill side of vLLM's NixlConnector: keep the KV blocks, say where they are.
        answer["kv_transfer_params"] = {
            "do_remote_decode": False,
            "do_remote_prefill": True,
            "remote_engine_id": f"engine-{name}",
            "remote_block_ids": [1, 2, 3],
            "remote_host": "127.0.0.1",
            "remote_port": 5600,
        }
    return answer


def _chunk(model: str, text: str) -> bytes:
    chunk = {
        "id": "chunk",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
    }
    return f"data: {json.dumps(chunk)}\n\n".encode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", required=True, type=int)
    parser.add_argument("--model", required=True)
    parser.add_argument("--name", required=True, help="names the prefill side's KV engine id")
    parser.add_argument("--token-seconds", type=float, default=0.05)
    args = parser.parse_args()
    app = create_app(args.model, args.name, args.token_seconds)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning")
    _AbortOnSigterm(config).run()


class _AbortOnSigterm(uvicorn.Server):
    """Exits at the first SIGTERM or SIGINT, cutting every request off, as vLLM does with the
    launcher's `--shutdown-timeout 0`: a request the drain did not wait for is lost, visibly."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        os._exit(0)


if __name__ == "__main__":
    main()
