"""A stand-in OpenAI engine that answers in microseconds, for measuring what a proxy adds.

One process serves every port it is given (one "engine" each) on 127.0.0.1 (or `--host`), with
uvloop and httptools on raw asyncio protocols: no framework, every answer prebuilt bytes, the
request body never decoded (a 100,000-token prompt costs the engine only its read). It speaks
enough of vLLM's OpenAI server for the llmfleet gateway, vllm-router and LiteLLM's proxy:

- `POST /v1/chat/completions`, `POST /v1/completions`: a fixed answer with `usage`; with
  `"stream": true` in the body, `--stream-chunks` SSE chunks (the first at once, then one every
  `--chunk-interval-ms`), a last chunk with `finish_reason` and usage, and `data: [DONE]`;
- `GET /v1/models`, `/health`, `/health/ready`, `/healthz`, `/readyz`, `/ping`: 200;
- `GET /metrics`: vLLM's gauges the gateways scrape (running = streams under way on that port).

    python bench/fake_engine.py --ports 8001,8002 [--stream-chunks 16] [--chunk-interval-ms 2]

Prints `ready` on stdout once every port listens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from typing import cast

import httptools
import uvloop

MODEL = "bench-model"
_STREAM_TRUE = re.compile(rb'"stream"\s*:\s*true')
_CREATED = int(time.time())
_USAGE = {"prompt_tokens": 3, "completion_tokens": 8, "total_tokens": 11}


def _json(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _response(status: bytes, content_type: bytes, body: bytes) -> bytes:
    return (
        b"HTTP/1.1 " + status + b"\r\ncontent-type: " + content_type + b"\r\ncontent-length: "
        + str(len(body)).encode() + b"\r\n\r\n" + body
    )  # fmt: skip


def _chat_answer() -> bytes:
    message = {"role": "assistant", "content": "hello from the fake engine"}
    body = {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": _CREATED,
        "model": MODEL,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}],
        "usage": _USAGE,
    }
    return _response(b"200 OK", b"application/json", _json(body))


def _text_answer() -> bytes:
    choice = {"index": 0, "text": "hello from the fake engine", "logprobs": None}
    body = {
        "id": "cmpl-fake",
        "object": "text_completion",
        "created": _CREATED,
        "model": MODEL,
        "choices": [{**choice, "finish_reason": "stop"}],
        "usage": _USAGE,
    }
    return _response(b"200 OK", b"application/json", _json(body))


def _sse(event: object) -> bytes:
    """One SSE event as one HTTP/1.1 chunk (chunked transfer encoding)."""
    data = b"data: " + (event if isinstance(event, bytes) else _json(event)) + b"\n\n"
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _stream_events(chat: bool, chunks: int) -> tuple[bytes, bytes, bytes]:
    """(head with the first chunk, each middle chunk, the last chunk with [DONE] and the end)."""
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
        b"transfer-encoding: chunked\r\n\r\n"
    )
    if chat:
        base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": _CREATED}

        def choice(content: str | None, finish: str | None) -> dict[str, object]:
            delta = {"content": content} if content is not None else {}
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}

        opening = {**choice("tok", None), "delta": {"role": "assistant", "content": "tok"}}
        first = {**base, "model": MODEL, "choices": [opening]}
    else:
        base = {"id": "cmpl-fake", "object": "text_completion", "created": _CREATED}

        def choice(content: str | None, finish: str | None) -> dict[str, object]:
            return {"index": 0, "text": content or "", "logprobs": None, "finish_reason": finish}

        first = {**base, "model": MODEL, "choices": [choice("tok", None)]}
    middle = {**base, "model": MODEL, "choices": [choice(" tok", None)]}
    usage = {**_USAGE, "completion_tokens": chunks, "total_tokens": 3 + chunks}
    last = {**base, "model": MODEL, "choices": [choice(None, "stop")], "usage": usage}
    return head + _sse(first), _sse(middle), _sse(last) + _sse(b"[DONE]") + b"0\r\n\r\n"


def _metrics(running: int) -> bytes:
    labels = f'{{model_name="{MODEL}",engine="0"}}'
    lines = [
        f"vllm:num_requests_running{labels} {running}",
        f"vllm:num_requests_waiting{labels} 0",
        f"vllm:kv_cache_usage_perc{labels} 0.0",
    ]
    return _response(b"200 OK", b"text/plain; version=0.0.4", ("\n".join(lines) + "\n").encode())


class Answers:
    """Every answer, built once."""

    def __init__(self, chunks: int, interval: float) -> None:
        self.chat = _chat_answer()
        self.text = _text_answer()
        self.chat_stream = _stream_events(chat=True, chunks=chunks)
        self.text_stream = _stream_events(chat=False, chunks=chunks)
        self.chunks = chunks
        self.interval = interval
        model = {"id": MODEL, "object": "model", "created": _CREATED, "owned_by": "fake-engine"}
        models = {"object": "list", "data": [{**model, "max_model_len": 1 << 20}]}
        self.models = _response(b"200 OK", b"application/json", _json(models))
        self.ok = _response(b"200 OK", b"application/json", b"{}")
        self.not_found = _response(b"404 Not Found", b"application/json", b'{"error":"no route"}')


class Engine(asyncio.Protocol):
    """One HTTP/1.1 connection: requests answered in arrival order; a stream in progress holds
    the requests pipelined behind it until it has ended."""

    def __init__(self, answers: Answers, streams: list[int]) -> None:
        self.answers = answers
        self.streams = streams  # [streams under way on this port], shared by its connections
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body: list[bytes] = []
        self.pending: list[tuple[bytes, bytes, bytes, bool]] = []
        self.streaming: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.streaming is not None:
            self.streaming.cancel()

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.close()

    # httptools callbacks
    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        method = self.parser.get_method()
        path = self.url.split(b"?", 1)[0]
        self.pending.append((method, path, b"".join(self.body), self.parser.should_keep_alive()))
        self.url = b""
        self.body = []
        if self.streaming is None:
            self._answer_pending()

    def _answer_pending(self) -> None:
        while self.pending and self.transport is not None:
            method, path, body, keep_alive = self.pending.pop(0)
            if method == b"POST" and path in (b"/v1/chat/completions", b"/v1/completions"):
                chat = path == b"/v1/chat/completions"
                if b'"stream"' in body and _STREAM_TRUE.search(body):
                    events = self.answers.chat_stream if chat else self.answers.text_stream
                    self.streaming = asyncio.get_running_loop().create_task(
                        self._stream(events, keep_alive)
                    )
                    return
                self.transport.write(self.answers.chat if chat else self.answers.text)
            elif path == b"/metrics":
                self.transport.write(_metrics(self.streams[0]))
            elif path == b"/v1/models":
                self.transport.write(self.answers.models)
            elif path in (b"/health", b"/health/ready", b"/healthz", b"/readyz", b"/ping"):
                self.transport.write(self.answers.ok)
            else:
                self.transport.write(self.answers.not_found)
            if not keep_alive:
                self.transport.close()

    def _write(self, data: bytes) -> bool:
        """Send `data`; False when the client has gone."""
        if self.transport is None:
            return False
        self.transport.write(data)
        return True

    async def _stream(self, events: tuple[bytes, bytes, bytes], keep_alive: bool) -> None:
        head, middle, last = events
        self.streams[0] += 1
        try:
            if not self._write(head):
                return
            for _ in range(self.answers.chunks - 1):
                if self.answers.interval:
                    await asyncio.sleep(self.answers.interval)
                if not self._write(middle):
                    return
            if self._write(last) and not keep_alive and self.transport is not None:
                self.transport.close()
        finally:
            self.streams[0] -= 1
            self.streaming = None
        self._answer_pending()


async def serve(ports: list[int], answers: Answers, host: str = "127.0.0.1") -> None:
    loop = asyncio.get_running_loop()
    servers = []
    for port in ports:
        streams = [0]
        servers.append(
            await loop.create_server(
                lambda streams=streams: Engine(answers, streams),  # type: ignore[misc]
                host,
                port,
                backlog=4096,
            )
        )
    print("ready", flush=True)
    await asyncio.gather(*(server.serve_forever() for server in servers))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ports", required=True, help="comma-separated ports, one engine each")
    parser.add_argument("--stream-chunks", type=int, default=16)
    parser.add_argument("--chunk-interval-ms", type=float, default=2.0)
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (0.0.0.0 inside a run's own namespace only)",
    )
    args = parser.parse_args()
    answers = Answers(args.stream_chunks, args.chunk_interval_ms / 1000)
    ports = [int(port) for port in args.ports.split(",")]
    uvloop.run(serve(ports, answers, args.host))


if __name__ == "__main__":
    main()
