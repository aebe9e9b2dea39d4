"""`spec.traffic` (gateway policies) and `spec.rollout` (canary) of an InferenceService."""

from __future__ import annotations

from enum import StrEnum
from itertools import pairwise
from typing import Annotated

from pydantic import Field

from llmfleet.crds._base import ApiModel, Rule
from llmfleet.crds.spec import DNS_LABEL


class CoalesceSpec(ApiModel):
    enabled: bool = False
    """Serve identical in-flight requests of one tenant with one upstream call."""
    window_ms: Annotated[int, Field(ge=0, le=60_000)] = 0
    """How long a finished response may still answer an identical request (0: in-flight only)."""


class DebounceMode(StrEnum):
    OFF = "Off"
    LATEST_WINS = "LatestWins"


class DebounceSpec(ApiModel):
    mode: DebounceMode = DebounceMode.OFF
    """`LatestWins`: a newer request of the same session cancels the older one."""
    window_ms: Annotated[int, Field(ge=0, le=60_000)] = 300
    """Requests of one session closer than this supersede each other."""


class CascadeTier(ApiModel):
    service: Annotated[str, Field(pattern=DNS_LABEL, max_length=63)]
    """InferenceService (same namespace) of this tier, cheapest first."""
    escalate_below_confidence: Annotated[float, Field(gt=0, lt=1)] = 0.7
    """Escalate to the next tier when this tier's answer confidence is below this."""
    max_prompt_tokens: Annotated[int, Field(ge=1)] | None = None
    """Longer prompts skip this tier."""


class CascadeSpec(ApiModel):
    tiers: Annotated[list[CascadeTier], Field(max_length=8)] = []
    """Tiers tried in order before this service answers."""


class LimitsSpec(ApiModel):
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    """Cap on `max_tokens` per request."""
    timeout_seconds: Annotated[float, Field(gt=0, le=3600)] | None = None
    """Per-request timeout at the gateway."""
    requests_per_minute: Annotated[int, Field(ge=1)] | None = None
    """Per-tenant request rate limit."""
    tokens_per_minute: Annotated[int, Field(ge=1)] | None = None
    """Per-tenant token rate limit."""


class TrafficSpec(ApiModel):
    coalesce: CoalesceSpec = Field(default_factory=CoalesceSpec)
    """Request coalescing."""
    debounce: DebounceSpec = Field(default_factory=DebounceSpec)
    """Request debouncing per session."""
    cascade: CascadeSpec = Field(default_factory=CascadeSpec)
    """Model cascading: cheaper tiers first."""
    limits: LimitsSpec = Field(default_factory=LimitsSpec)
    """Timeouts, token caps and rate limits."""


class RolloutStrategy(StrEnum):
    ROLLING_UPDATE = "RollingUpdate"
    CANARY = "Canary"


class CanaryStep(ApiModel):
    weight: Annotated[int, Field(ge=1, le=100)]
    """Percent of traffic the new revision gets in this step."""
    pause_seconds: Annotated[int, Field(ge=0, le=86_400)] = 300
    """How long to hold this step (and analyse it) before the next."""


class AnalysisSpec(ApiModel):
    interval_seconds: Annotated[int, Field(ge=5, le=3600)] = 60
    """How often the canary is compared with the stable revision."""
    max_ttft_p95_ms: Annotated[float, Field(gt=0)] | None = None
    """Roll back when the canary's TTFT p95 exceeds this (default: the service's SLO)."""
    max_itl_p95_ms: Annotated[float, Field(gt=0)] | None = None
    """Roll back when the canary's ITL p95 exceeds this (default: the service's SLO)."""
    max_error_rate: Annotated[float, Field(ge=0, le=1)] = 0.01
    """Roll back when more than this fraction of the canary's requests fail."""


class RolloutSpec(ApiModel):
    strategy: RolloutStrategy = RolloutStrategy.ROLLING_UPDATE
    """`RollingUpdate` replaces pods in place; `Canary` shifts traffic by steps with analysis."""
    steps: Annotated[list[CanaryStep], Field(max_length=20)] = []
    """Canary steps, weights rising."""
    analysis: AnalysisSpec = Field(default_factory=AnalysisSpec)
    """SLO analysis that promotes or rolls back a canary."""

    rules = (
        Rule(
            cel="self.strategy != 'Canary' || size(self.steps) > 0",
            message="strategy Canary needs at least one step",
            field_path=".steps",
            reason="FieldValueRequired",
            check=lambda r: r.strategy != RolloutStrategy.CANARY or len(r.steps) > 0,
        ),
        Rule(
            cel="self.steps.map(s, s.weight).isSorted() && "
            "self.steps.all(s, self.steps.exists_one(t, t.weight == s.weight))",
            message="canary step weights must rise from step to step",
            field_path=".steps",
            check=lambda r: all(a.weight < b.weight for a, b in pairwise(r.steps)),
        ),
    )
