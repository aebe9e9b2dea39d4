"""What `llmfleet load` sends and when: pure, no I/O.

Timing: request i is sent `arrival_i / speed` seconds after the replay starts (open loop: send
times never depend on answers). `duration_s` keeps the requests sent before that many seconds of
replay, i.e. those whose trace arrival is below `duration_s * speed`.

Prompts: the traces carry token counts, not text, so a prompt is made of words that are one
token each. A word is three lowercase letters and a space (`"kav "`):
- llm-d-inference-sim's dummy tokenizer (`--force-dummy-tokenizer`, and any model name it does
  not find on a hub) counts a run of word characters and the spaces after it as one token, so
  an N-word prompt is exactly N prompt tokens there;
- the gateway, which has no tokenizer, estimates 4 characters a token, which a 4-character word
  also matches exactly, so its in-flight token accounting sees the trace's figures;
- a real model's tokenizer may split such words into more than one token, so against a real
  engine prompts may be longer than the trace's; the summary's prompt-token ratio (what the
  engine counted / what the trace asked) says by how much.
Mooncake's `hash_ids` are the prompt's 512-token blocks: the same hash id gives the same 512
words (its last block may be cut short, as the trace's lengths say), so requests that share
blocks share a prefix in text, in the gateway's prefix key and in an engine's prefix cache. An
Azure request, or the part of a Mooncake prompt beyond its blocks, is words no other request
has. Every word is drawn from a seeded generator: the same seed gives the same text in every
run, a different seed keeps a replay from hitting prefix caches a previous run warmed.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from llmfleet.autoscaler.sim.traces import MOONCAKE_BLOCK_TOKENS, Trace
from llmfleet.core.errors import UserError

WORDS: tuple[str, ...] = tuple(
    a + b + c + " "
    for a in string.ascii_lowercase
    for b in string.ascii_lowercase
    for c in string.ascii_lowercase
)
"""The 17,576 one-token words, each with its trailing space."""
WORD_CHARS = 4
"""Characters per word, its space included."""


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    index: int
    """Position in the trace (0-based, in arrival order)."""
    send_at: float
    """Seconds after the replay starts."""
    prompt_tokens: int
    max_tokens: int
    """The trace's output length."""
    blocks: tuple[int, ...] = ()
    """Mooncake `hash_ids`: prefix blocks shared with other requests that name them."""


def plan(
    trace: Trace, *, speed: float = 1.0, duration_s: float | None = None
) -> list[PlannedRequest]:
    """The requests of `trace` with their send times at `speed` times the trace's pace, cut
    at `duration_s` seconds of replay (requests sent at or after it are left out)."""
    if not speed > 0:
        raise UserError(f"--speed must be above 0, got {speed:g}")
    if duration_s is not None and not duration_s > 0:
        raise UserError(f"--duration must be above 0 seconds, got {duration_s:g}")
    planned = []
    for index, request in enumerate(trace.requests):
        send_at = request.arrival / speed
        if duration_s is not None and send_at >= duration_s:
            break  # the trace is sorted by arrival
        planned.append(
            PlannedRequest(
                index, send_at, request.prompt_tokens, request.output_tokens, request.blocks
            )
        )
    return planned


class PromptBuilder:
    """Prompt text for planned requests: one word a token, one text per hash id (see the
    module's docstring). Block texts are cached (`cached_blocks` of them, 2 KiB each)."""

    def __init__(
        self,
        seed: int,
        *,
        block_tokens: int = MOONCAKE_BLOCK_TOKENS,
        cached_blocks: int = 8192,
    ) -> None:
        self.seed = seed
        self.block_tokens = block_tokens
        self._block: Callable[[int], str] = lru_cache(maxsize=cached_blocks)(self._make_block)

    def block(self, hash_id: int) -> str:
        """The `block_tokens` words of Mooncake block `hash_id`."""
        return self._block(hash_id)

    def prompt(self, request: PlannedRequest) -> str:
        """`request.prompt_tokens` words: its blocks' words first, then words of its own."""
        parts = []
        remaining = request.prompt_tokens
        for hash_id in request.blocks:
            if remaining <= 0:
                break
            take = min(remaining, self.block_tokens)
            parts.append(self.block(hash_id)[: take * WORD_CHARS])
            remaining -= take
        if remaining > 0:
            parts.append(self._words(f"request:{request.index}", remaining))
        return "".join(parts)

    def _make_block(self, hash_id: int) -> str:
        return self._words(f"block:{hash_id}", self.block_tokens)

    def _words(self, key: str, count: int) -> str:
        # A str seed is hashed with SHA-512: the same text in every process and run.
        rng = random.Random(f"{self.seed}:{key}")
        return "".join(rng.choices(WORDS, k=count))
