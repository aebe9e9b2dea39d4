"""The few fields of an OpenAI request the gateway acts on; the rest travels as the client sent it.

One decode with msgspec into a struct of the fields the gateway reads (`model`, `stream`, the
token limits, `n`, `temperature`, `user`), with strict types (a `stream` of `"yes"` or a
`max_tokens` of `true` is refused here, as the engine would refuse it). The prompt (`messages`
or `prompt`) is kept as the raw JSON bytes it arrived as: it is checked for its outer shape,
its first bytes hashed for the prefix key and its length turned into a token estimate, but never
copied or decoded into Python objects, so a 100,000-token prompt costs the scan msgspec makes of
it (~0.7 ms) and nothing more. The whole body as a dict (`ParsedRequest.body`) is decoded only
when a traffic policy asks for it.

The body's bytes go upstream unchanged unless the gateway must change a field; then `spliced`
appends the new values before the closing brace instead of re-encoding the body. JSON objects
with a repeated key take the last value in every parser an engine uses (Python's json, orjson,
pydantic, Go's encoding/json), so the appended value is the one the engine sees.

Bad input is an `InvalidRequestError` naming the field (status 400): not JSON, not UTF-8, a
lone surrogate escape, nesting deeper than the decoder's limit, wrong types, out-of-range values.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Annotated, Any

import msgspec
import orjson

from llmfleet.gateway.routing.prefix_affinity import stable_hash

DEFAULT_OUTPUT_TOKENS = 256
"""Output tokens assumed for in-flight accounting when a request sets no limit."""

MAX_CONTEXT_TOKENS = 10_485_760
"""The largest context an InferenceService may declare (`engine.maxModelLen`'s bound): any
token limit above it is capped to it, so no figure the gateway computes can overflow."""

_ID_SAMPLE_BYTES = 65_536
"""Token-id prompts are counted on this many leading bytes and scaled to the whole length
(counting every comma of a 100,000-id prompt costs ~0.4 ms; the sample, ~0.03 ms)."""

_Positive = Annotated[int, msgspec.Meta(ge=1)]


class _Fields(msgspec.Struct, forbid_unknown_fields=False):
    """The fields both routes read; every other field is skipped by the decoder."""

    model: Annotated[str, msgspec.Meta(min_length=1)]
    stream: bool | None = None
    max_tokens: _Positive | None = None
    max_completion_tokens: _Positive | None = None
    n: _Positive | None = None
    temperature: Annotated[float, msgspec.Meta(ge=0)] | None = None
    user: str | None = None


class _ChatFields(_Fields):
    messages: msgspec.Raw = msgspec.Raw(b"")


class _CompletionFields(_Fields):
    prompt: msgspec.Raw = msgspec.Raw(b"")


_CHAT = msgspec.json.Decoder(_ChatFields)
_COMPLETION = msgspec.json.Decoder(_CompletionFields)


class InvalidRequestError(ValueError):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass
class ParsedRequest:
    """A request's fields, its raw prompt and (on demand) its whole body."""

    raw: bytes
    """The body as the client sent it (or as `retarget`/a cap rewrote it)."""
    chat: bool
    model: str
    stream: bool
    max_tokens: int | None
    """The client's output limit (`max_completion_tokens`, else `max_tokens`) as sent, however
    large; None when it set none. Figures derived from it are bounded (`tokens`)."""
    user: str | None
    prompt: bytes | memoryview = b""
    """The raw JSON of `messages` (chat) or `prompt` (completions)."""
    prompt_tokens: int = 0
    """Estimated prompt tokens: token ids counted, text at 4 characters (bytes) a token."""
    _body: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def body(self) -> dict[str, Any]:
        """The whole body as a dict, decoded on first use (by the policies that need it)."""
        if self._body is None:
            self._body = orjson.loads(self.raw)
        return self._body

    def tokens(self) -> int:
        """Estimated prompt + output tokens (no tokenizer here)."""
        output = DEFAULT_OUTPUT_TOKENS if self.max_tokens is None else self.max_tokens
        return self.prompt_tokens + min(output, MAX_CONTEXT_TOKENS)

    def prefix_key(self, block_chars: int, blocks: int) -> int | None:
        """Hash of the prompt's leading whole blocks (at most `blocks` of `block_chars` bytes of
        its JSON; all of a short prompt). Only those bytes are read."""
        size = len(self.prompt)
        if size <= 2:  # "" or [] : nothing to share
            return None
        whole = min(blocks, size // block_chars)
        head = self.prompt[: whole * block_chars] if whole else self.prompt
        return stable_hash(bytes(head))

    @cached_property
    def prompt_text(self) -> str:
        """The prompt's text (chat: `role:content` lines), for the cascade's heuristics; decodes
        the whole prompt, so only policies that read words call it."""
        body = self.body
        if self.chat:
            return _chat_text(body.get("messages") or [])
        return _prompt_text(body.get("prompt", ""))

    def changed(self, fields: dict[str, Any]) -> ParsedRequest:
        """This request with `fields` set in its body (spliced into the bytes)."""
        stream = bool(fields.get("stream", self.stream))
        return replace(self, raw=spliced(self.raw, fields), stream=stream, _body=None)

    def with_body(self, body: dict[str, Any], model: str) -> ParsedRequest:
        """This request with another body (already naming `model`): a cascade tier's or a
        degradation target's; the prompt is the same."""
        raw = orjson.dumps(body)
        return ParsedRequest(raw, self.chat, model, self.stream, self.max_tokens, self.user,
                             self.prompt, self.prompt_tokens, body)  # fmt: skip


def parse(raw: bytes, *, chat: bool) -> ParsedRequest:
    """The request in `raw`; InvalidRequestError (status 400) names the offending field."""
    if not raw.isascii():
        try:
            raw.decode()
        except UnicodeDecodeError as error:
            raise InvalidRequestError(
                f"the request body is not valid UTF-8 (byte {error.start}): send JSON as UTF-8"
            ) from None
    try:
        fields: _ChatFields | _CompletionFields = (_CHAT if chat else _COMPLETION).decode(raw)
    except msgspec.ValidationError as error:
        message, param = _validation_message(str(error))
        raise InvalidRequestError(message, param) from None
    except msgspec.DecodeError as error:
        raise InvalidRequestError(_decode_message(raw, error)) from None
    except RecursionError:
        raise InvalidRequestError(
            "the request body is nested too deeply (limit: about 1,000 levels of arrays and "
            "objects)"
        ) from None
    limit = fields.max_completion_tokens or fields.max_tokens
    if isinstance(fields, _ChatFields):
        prompt = fields.messages
        tokens = _checked_messages(prompt)
    else:
        prompt = fields.prompt
        tokens = _checked_prompt(prompt)
    return ParsedRequest(
        raw,
        chat,
        fields.model,
        bool(fields.stream),
        limit,
        fields.user,
        memoryview(prompt),
        tokens,
    )


def _first(data: memoryview, start: int = 0) -> int:
    """Index of the first byte at or after `start` that is not JSON whitespace (len if none)."""
    i = start
    while i < len(data) and data[i] in b" \t\r\n":
        i += 1
    return i


def _checked_messages(messages: msgspec.Raw) -> int:
    data = memoryview(messages)
    if not data:
        raise InvalidRequestError("messages: Field required", param="messages")
    first = _first(data)
    if data[first] != ord("["):
        raise InvalidRequestError("messages: must be an array of messages", param="messages")
    inner = _first(data, first + 1)
    if data[inner] == ord("]"):
        raise InvalidRequestError("messages: must hold at least one message", param="messages")
    if data[inner] != ord("{"):
        raise InvalidRequestError("messages.0: a message must be an object", param="messages")
    return len(data) // 4


def _checked_prompt(prompt: msgspec.Raw) -> int:
    data = memoryview(prompt)
    if not data:
        raise InvalidRequestError("prompt: Field required", param="prompt")
    first = _first(data)
    shape = "prompt: must be a string, an array of strings, or token ids"
    if data[first] == ord('"'):
        return len(data) // 4
    if data[first] != ord("["):
        raise InvalidRequestError(shape, param="prompt")
    inner = _first(data, first + 1)
    if data[inner] == ord("]"):
        raise InvalidRequestError("prompt: must not be empty", param="prompt")
    item = data[inner]
    if item == ord('"'):
        return len(data) // 4
    if item == ord("[") or item in b"0123456789-":  # token ids: one per comma, roughly
        sample = bytes(data[:_ID_SAMPLE_BYTES])
        return sample.count(b",") * len(data) // len(sample) + 1
    raise InvalidRequestError(shape, param="prompt")


def _validation_message(text: str) -> tuple[str, str | None]:
    """msgspec's "Expected `int`, got `str` - at `$.max_tokens`" as "max_tokens: ..."."""
    message, sep, where = text.rpartition(" - at `$.")
    if not sep:
        if text.startswith("Object missing required field `"):
            name = text.split("`")[1]
            return f"{name}: Field required", name
        if text.startswith("Expected `object`"):
            return "the request body must be a JSON object", None
        return text, None
    param = where.rstrip("`")
    message = message.replace("Expected `int` >= 1", "must be an integer of at least 1")
    message = message.replace("Expected `float` >= 0.0", "must be a number of at least 0")
    message = message.replace("Expected `str` of length >= 1", "must not be empty")
    return f"{param}: {message}", param


def _decode_message(raw: bytes, error: msgspec.DecodeError) -> str:
    """Why `raw` is not JSON, in orjson's words when it has better ones (it names lone
    surrogates; msgspec calls them "truncated")."""
    try:
        orjson.loads(raw)
    except orjson.JSONDecodeError as detail:
        reason = str(detail)
        if "surrogate" in reason:
            return f"the request body has invalid Unicode: {reason}"
        return f"the request body is not valid JSON: {reason}"
    return f"the request body is not valid JSON: {error}"


def _chat_text(messages: list[Any]) -> str:
    parts: list[str] = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, list):  # content parts: only text counts
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        parts.append(f"{message.get('role', '')}:{content or ''}\n")
    return "".join(parts)


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        return "".join(item if isinstance(item, str) else str(item) for item in prompt)
    return ""


def spliced(raw: bytes, fields: dict[str, Any]) -> bytes:
    """`raw` (a JSON object) with `fields` set: appended before its closing brace, so the body
    is not re-encoded (see the module's note on repeated keys)."""
    end = raw.rstrip().rfind(b"}")
    extra = orjson.dumps(fields)[1:-1]  # the members, without their braces
    return raw[:end] + b"," + extra + raw[end:]


def capped(parsed: ParsedRequest, cap: int | None, context: int) -> ParsedRequest | None:
    """The request with its output limit lowered to `cap` (set when absent), and in any case
    to the model's `context` (a limit beyond it can never be met, and huge numbers break what
    counts tokens); None if unchanged."""
    limit = min(cap, context) if cap is not None else context
    if (parsed.max_tokens is None and cap is None) or (
        parsed.max_tokens is not None and parsed.max_tokens <= limit
    ):
        return None
    fields: dict[str, Any] = {"max_tokens": limit}
    if parsed.max_tokens is not None:  # the client's own field may be the newer name
        fields["max_completion_tokens"] = limit
    return ParsedRequest(spliced(parsed.raw, fields), parsed.chat, parsed.model, parsed.stream,
                         limit, parsed.user, parsed.prompt, parsed.prompt_tokens)  # fmt: skip


def openapi_schema(chat: bool) -> dict[str, Any]:
    """The request body's JSON schema for /openapi.json: the fields the gateway checks, and
    any others (passed through to the engine)."""
    required = ["model", "messages" if chat else "prompt"]
    properties: dict[str, Any] = {
        "model": {"type": "string", "minLength": 1},
        "stream": {"type": ["boolean", "null"]},
        "max_tokens": {"type": ["integer", "null"], "minimum": 1},
        "max_completion_tokens": {"type": ["integer", "null"], "minimum": 1},
        "n": {"type": ["integer", "null"], "minimum": 1},
        "temperature": {"type": ["number", "null"], "minimum": 0},
        "user": {"type": ["string", "null"]},
    }
    if chat:
        properties["messages"] = {"type": "array", "minItems": 1, "items": {"type": "object"}}
    else:
        properties["prompt"] = {
            "anyOf": [
                {"type": "string"},
                {"type": "array", "minItems": 1, "items": {"type": "string"}},
                {"type": "array", "minItems": 1, "items": {"type": "integer"}},
                {
                    "type": "array",
                    "minItems": 1,
                    "items": {"type": "array", "items": {"type": "integer"}},
                },
            ]
        }
    return {
        "type": "object",
        "required": required,
        "properties": properties,
        "additionalProperties": True,
    }
