"""The few fields of an OpenAI request the gateway acts on; the rest travels as the client sent it.

Parsing the body once (json) and validating only `model`, `stream`, `stream_options`, the token
limits and the prompt keeps the per-request cost low and never drops a field the engine knows
(vLLM's `kv_transfer_params`, sampling extensions, ...): the body's bytes are forwarded unchanged
unless the gateway must change a field (max-token cap, P/D), and only then re-encoded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llmfleet.gateway.routing.prefix_affinity import stable_hash

DEFAULT_OUTPUT_TOKENS = 256
"""Output tokens assumed for in-flight accounting when a request sets no limit."""


class _Common(BaseModel):
    """Validated fields; `extra="allow"` documents the pass-through in the OpenAPI schema."""

    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1)
    stream: bool = False
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)


class ChatCompletionRequest(_Common):
    messages: list[dict[str, Any]] = Field(min_length=1)


class CompletionRequest(_Common):
    prompt: str | list[str] | list[int] | list[list[int]]


class InvalidRequestError(ValueError):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ParsedRequest:
    body: dict[str, Any]
    model: str
    stream: bool
    max_tokens: int | None
    prompt_text: str

    def tokens(self) -> int:
        """Estimated prompt + output tokens (4 characters a token; no tokenizer here)."""
        return len(self.prompt_text) // 4 + (self.max_tokens or DEFAULT_OUTPUT_TOKENS)

    def prefix_key(self, block_chars: int, blocks: int) -> int | None:
        """Hash of the prompt's leading whole blocks (at most `blocks`; all of a short prompt)."""
        if not self.prompt_text:
            return None
        whole = min(blocks, len(self.prompt_text) // block_chars)
        head = self.prompt_text[: whole * block_chars] if whole else self.prompt_text
        return stable_hash(head.encode())


def _chat_text(messages: list[dict[str, Any]]) -> str:
    parts: list[str] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):  # content parts: only text counts for the prefix
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        parts.append(f"{message.get('role', '')}:{content or ''}\n")
    return "".join(parts)


def _prompt_text(prompt: str | list[str] | list[int] | list[list[int]]) -> str:
    if isinstance(prompt, str):
        return prompt
    return "".join(str(item) if not isinstance(item, str) else item for item in prompt)


def parse(raw: bytes, *, chat: bool) -> ParsedRequest:
    """The request in `raw`; InvalidRequestError (status 400) names the offending field."""
    try:
        body = json.loads(raw)
    except ValueError as error:
        raise InvalidRequestError(f"the request body is not valid JSON: {error}") from None
    if not isinstance(body, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    try:
        if chat:
            request: _Common = ChatCompletionRequest.model_validate(body)
            text = _chat_text(body["messages"])
        else:
            completion = CompletionRequest.model_validate(body)
            request, text = completion, _prompt_text(completion.prompt)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise InvalidRequestError(f"{where}: {first['msg']}", param=where) from None
    limit = request.max_completion_tokens or request.max_tokens
    return ParsedRequest(body, request.model, request.stream, limit, text)


def capped(parsed: ParsedRequest, cap: int | None) -> dict[str, Any] | None:
    """The body with its token limit lowered to `cap` (set when absent); None if unchanged."""
    if cap is None or (parsed.max_tokens is not None and parsed.max_tokens <= cap):
        return None
    body = dict(parsed.body)
    body["max_tokens"] = cap
    if "max_completion_tokens" in body:
        body["max_completion_tokens"] = cap
    return body
