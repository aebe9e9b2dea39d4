"""The coalescing key: which requests may share one upstream call (pure; no I/O).

    canonical(body) = json.dumps(body, sort_keys=True, separators=(",", ":"))
    scope           = [tenant, session if sampled else None, path, priority, tier header]
    key             = sha256(json.dumps([*scope, body], sort_keys=True, compact))   (hex)
    sampled         = temperature > 0 and no seed   (an absent or null temperature counts as
                      OpenAI's default, 1; a temperature that is no number counts as sampled)

- Every field of the body is in the key, so whatever can change the answer (model, messages or
  prompt, every sampling parameter, `tools`, `response_format`, `stream`, `stream_options`, `n`,
  `seed`, `logprobs`, `user`, fields only one engine knows, ...) separates requests; only key
  order and whitespace (gone once the body is parsed) do not. JSON types stay apart: `1`,
  `1.0` and `true` are different keys (never merged wrongly, at worst not merged).
- A sampled request without a seed may give another answer each time: it shares an upstream
  call only within its session (a double click), never across the tenant's users; with no
  session it is not coalesced at all (the key is None).
- The scope also holds what a later stage reads outside the body and that changes who answers:
  the priority class (degradation sends sheddable traffic to a cheaper service) and the
  `x-llmfleet-tier` header (cascade).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

ANSWER_HEADERS = ("x-llmfleet-tier",)
"""Request headers (lower-case) that can change the answer: part of the key."""

DEFAULT_TEMPERATURE = 1.0
"""OpenAI's default temperature: a request that sets none samples."""


def sampled_without_seed(body: Mapping[str, Any]) -> bool:
    """True when repeating the request may give another answer (temperature > 0, no seed)."""
    if body.get("seed") is not None:
        return False
    temperature = body.get("temperature")
    if temperature is None:
        temperature = DEFAULT_TEMPERATURE
    if isinstance(temperature, bool) or not isinstance(temperature, int | float):
        return True  # the engine will refuse it; never merge on a value we cannot read
    return temperature > 0


def coalesce_key(
    body: Mapping[str, Any],
    *,
    path: str,
    tenant: str | None,
    session: str | None,
    priority: str = "standard",
    headers: Mapping[str, str] | None = None,
) -> str | None:
    """The key under which identical requests share one upstream call; None: never share."""
    sampled = sampled_without_seed(body)
    if sampled and session is None:
        return None
    hints = [(headers or {}).get(name) for name in ANSWER_HEADERS]
    scope = [tenant, session if sampled else None, path, priority, hints, body]
    text = json.dumps(scope, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()
