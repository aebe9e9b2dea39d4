"""The routing contract: what a plugin sees (`RoutingRequest`, `Candidate`) and the protocols."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Candidate:
    """One endpoint as the plugins see it (a snapshot; figures unknown to the gateway are 0)."""

    url: str
    waiting: float = 0.0
    """Requests queued in the engine (`vllm:num_requests_waiting`, last scrape)."""
    running: float = 0.0
    """Requests the engine is running (`vllm:num_requests_running`, last scrape)."""
    kv_usage: float = 0.0
    """KV-cache usage 0-1 (`vllm:kv_cache_usage_perc`, last scrape)."""
    in_flight: int = 0
    """Requests this gateway has sent to the endpoint and not yet finished (always current)."""
    in_flight_tokens: int = 0
    """Prompt + max output tokens (estimated) of those requests."""
    ejected: bool = False
    """The endpoint failed repeatedly and is out of rotation for a while."""
    stale: bool = False
    """The endpoint's figures were scraped once but are older than `metrics_stale_seconds`:
    an engine that stopped answering its /metrics (hung, SIGSTOPped) looks idle on figures
    that are no longer true, so it is not preferred."""


@dataclass(frozen=True)
class RoutingRequest:
    """What the plugins know about a request."""

    model: str
    prefix_key: int | None = None
    """Hash of the prompt's leading blocks (None without a prompt)."""
    tokens: int = 0
    """Estimated prompt + output tokens."""


class Filter(Protocol):
    def filter(self, request: RoutingRequest, candidates: Sequence[Candidate]) -> list[Candidate]:
        """The candidates that may serve the request (the pipeline ignores an empty answer)."""
        ...


class Scorer(Protocol):
    def score(self, request: RoutingRequest, candidates: Sequence[Candidate]) -> list[float]:
        """One score per candidate, in the same order; the pipeline clamps them to [0, 1]."""
        ...


class Picker(Protocol):
    def pick(self, candidates: Sequence[Candidate], scores: Sequence[float]) -> Candidate:
        """One of `candidates` (never empty), given each one's weighted score."""
        ...


def relative_headroom(values: Sequence[float]) -> list[float]:
    """`1 - v / max(v)` per value: 1 for the idlest, 0 for the busiest (all 1 when all are 0)."""
    top = max(values, default=0.0)
    if top <= 0:
        return [1.0] * len(values)
    return [1.0 - value / top for value in values]
