"""Which cascade tiers a request tries, before any of them is asked (pure; no I/O).

Inputs: the service's `spec.traffic.cascade`, the prompt's estimated tokens, the text the
keywords are looked for in, the `x-llmfleet-tier` request header, and which tiers discovery
knows. Rules, in this order:

1. `x-llmfleet-tier: large` skips every cheap tier (reason `header`).
2. A tier discovery does not know is skipped (`unavailable`); so is a tier whose
   `maxPromptTokens` the prompt exceeds (`long_prompt`).
3. A `hardKeywords` word in the text (case-insensitive, whole words: "explain" matches
   "Explain:" but not "explained") marks the request hard. Without `hedge`, the tiers left are
   skipped (`keyword`); with `hedge`, the first tier left is asked at the same time as this
   service, the others are skipped (`keyword`).

The tiers left are asked cheapest first; this service answers when none is confident.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llmfleet.crds.policy import CascadeSpec, CascadeTier

LARGE = "large"
"""The `x-llmfleet-tier` value that sends a request straight to the service itself."""


@dataclass(frozen=True)
class Plan:
    tiers: tuple[CascadeTier, ...]
    """Cheap tiers to ask, in order."""
    skipped: tuple[tuple[str, str], ...]
    """(tier service, reason) of the tiers a heuristic skipped."""
    hedge: bool = False
    """Ask `tiers[0]` and the service itself at once (then `tiers` has one element)."""
    hard: bool = False
    """A keyword matched."""


def plan(
    spec: CascadeSpec,
    *,
    prompt_tokens: int,
    text: str,
    tier_header: str | None,
    known: Callable[[str], bool],
) -> Plan:
    """The tiers to ask for one request (see the module's rules)."""
    if (tier_header or "").strip().lower() == LARGE:
        return Plan((), tuple((tier.service, "header") for tier in spec.tiers))
    eligible: list[CascadeTier] = []
    skipped: list[tuple[str, str]] = []
    for tier in spec.tiers:
        if not known(tier.service):
            skipped.append((tier.service, "unavailable"))
        elif tier.max_prompt_tokens is not None and prompt_tokens > tier.max_prompt_tokens:
            skipped.append((tier.service, "long_prompt"))
        else:
            eligible.append(tier)
    hard = bool(eligible) and _keywords(tuple(spec.hard_keywords)).search(text) is not None
    if not hard:
        return Plan(tuple(eligible), tuple(skipped))
    kept = eligible[:1] if spec.hedge else []
    skipped += [(tier.service, "keyword") for tier in eligible[len(kept) :]]
    return Plan(tuple(kept), tuple(skipped), hedge=spec.hedge, hard=True)


@functools.lru_cache(maxsize=64)
def _keywords(words: tuple[str, ...]) -> re.Pattern[str]:
    if not words:
        return re.compile(r"(?!)")  # matches nothing
    alternatives = "|".join(re.escape(word) for word in words)
    return re.compile(rf"(?<!\w)(?:{alternatives})(?!\w)", re.IGNORECASE)


def hint_text(body: Mapping[str, Any], prompt_text: str) -> str:
    """Where keywords are looked for: a chat's last user message (not the system prompt or
    earlier turns, which would mark every request of a conversation), else the prompt."""
    messages = body.get("messages")
    if not isinstance(messages, Sequence) or isinstance(messages, str):
        return prompt_text
    for message in reversed(messages):
        if isinstance(message, Mapping) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):  # content parts: only the text ones
                texts = [p.get("text") for p in content if isinstance(p, Mapping)]
                return " ".join(str(text) for text in texts if text is not None)
            return content if isinstance(content, str) else ""
    return prompt_text


def prompt_tokens(prompt_text: str) -> int:
    """The prompt's tokens, estimated as the gateway does elsewhere: 4 characters a token."""
    return len(prompt_text) // 4
