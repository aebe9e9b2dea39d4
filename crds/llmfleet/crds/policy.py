"""`spec.traffic` (gateway policies) and `spec.rollout` (canary) of an InferenceService."""

from __future__ import annotations

from enum import StrEnum
from itertools import pairwise
from typing import Annotated

from pydantic import Field

from llmfleet.crds import labels as L
from llmfleet.crds._base import ApiModel, Rule
from llmfleet.crds.spec import MAX_EXACT_INTEGER, MAX_TOKENS

ServiceName = Annotated[
    str, Field(pattern=L.SERVICE_NAME_PATTERN, max_length=L.SERVICE_NAME_MAX_LENGTH)
]
"""The name of another InferenceService: a name an InferenceService can have."""


def _lower_ascii(text: str) -> str:
    """CEL's `lowerAscii()`: only A-Z change."""
    return text.translate(str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz"))


class CoalesceSpec(ApiModel):
    enabled: bool = False
    """Serve identical in-flight requests of one tenant with one upstream call."""
    window_ms: Annotated[int, Field(ge=0, le=60_000)] = 0
    """How long a finished response may still answer an identical request (0: in-flight only)."""

    rules = (
        Rule(
            cel="self.enabled || self.windowMs == 0",
            message="coalesce.windowMs does nothing while coalesce.enabled is false: set "
            "enabled: true, or remove windowMs",
            field_path=".windowMs",
            check=lambda c: c.enabled or c.window_ms == 0,
        ),
    )


class DebounceMode(StrEnum):
    OFF = "Off"
    LATEST_WINS = "LatestWins"


class DebounceSpec(ApiModel):
    mode: DebounceMode = DebounceMode.OFF
    """`LatestWins`: a newer request of the same session cancels the older one."""
    window_ms: Annotated[int, Field(ge=0, le=60_000)] = 300
    """Requests of one session closer than this supersede each other."""
    delay_ms: Annotated[int, Field(ge=0, le=60_000)] = 5
    """How long a request is held before dispatch (with `LatestWins`), so that a newer one of
    the same session can supersede it before it reaches an engine."""

    rules = (
        Rule(
            cel="self.delayMs <= self.windowMs",
            message="debounce delayMs cannot exceed windowMs (by default 5 and 300): set both",
            field_path=".delayMs",
            check=lambda d: d.delay_ms <= d.window_ms,
        ),
        Rule(
            cel="self.mode == 'LatestWins' || self.windowMs == 300",
            message="debounce.windowMs acts only with debounce.mode LatestWins, and mode is Off "
            "(its default): set mode: LatestWins, or remove windowMs",
            field_path=".windowMs",
            check=lambda d: d.mode == DebounceMode.LATEST_WINS or d.window_ms == 300,
            ratchets=True,
        ),
        Rule(
            cel="self.mode == 'LatestWins' || self.delayMs == 5",
            message="debounce.delayMs acts only with debounce.mode LatestWins, and mode is Off "
            "(its default): set mode: LatestWins, or remove delayMs",
            field_path=".delayMs",
            check=lambda d: d.mode == DebounceMode.LATEST_WINS or d.delay_ms == 5,
            ratchets=True,
        ),
    )


class CascadeTier(ApiModel):
    service: ServiceName
    """InferenceService (same namespace) of this tier, cheapest first."""
    escalate_below_confidence: Annotated[float, Field(gt=0, lt=1)] = 0.7
    """Escalate to the next tier when this tier's answer confidence is below this."""
    max_prompt_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS)] | None = None
    """Longer prompts skip this tier."""


class ConfidenceMethod(StrEnum):
    MEAN_PROBABILITY = "MeanProbability"
    MIN_WINDOW_PROBABILITY = "MinWindowProbability"


WINDOW_TOKENS = 8
"""`cascade.windowTokens` by default (its rule refuses another value without the window's mode)."""


class CascadeSpec(ApiModel):
    tiers: Annotated[list[CascadeTier], Field(max_length=8)] = []
    """Tiers tried in order before this service answers."""
    confidence: ConfidenceMethod = ConfidenceMethod.MEAN_PROBABILITY
    """How an answer's confidence is computed from its token logprobs: `MeanProbability`, the
    mean of the tokens' probabilities; `MinWindowProbability`, the lowest mean probability over
    any `windowTokens` consecutive tokens (one unsure stretch is enough to escalate)."""
    window_tokens: Annotated[int, Field(ge=1, le=4096)] = WINDOW_TOKENS
    """Window of `MinWindowProbability`, in tokens."""
    hard_keywords: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=64)]], Field(max_length=64)
    ] = ["explain", "analyze", "analyse", "prove"]
    """Words (case-insensitive, in the last user message or the prompt) that mark a request as
    probably hard: it skips the cheap tiers, or is hedged when `hedge` is on."""
    hedge: bool = False
    """Send probably-hard requests to the first cheap tier and this service at once; answer with
    the cheap answer when it is confident, else the other, and cancel the loser."""

    rules = (
        Rule(
            cel="self.tiers.all(t, self.tiers.exists_one(u, u.service == t.service))",
            message="cascade.tiers name each service once (a tier that failed or was unsure "
            "would be asked again)",
            field_path=".tiers",
            check=lambda c: len({t.service for t in c.tiers}) == len(c.tiers),
        ),
        Rule(
            cel="self.hardKeywords.all(k, "
            "self.hardKeywords.exists_one(j, j.lowerAscii() == k.lowerAscii()))",
            message="cascade.hardKeywords name each word once (they match in any case)",
            field_path=".hardKeywords",
            check=lambda c: len({_lower_ascii(k) for k in c.hard_keywords}) == len(c.hard_keywords),
        ),
        Rule(
            cel="!self.hedge || size(self.tiers) > 0",
            message="cascade.hedge needs a tier to hedge with: add cascade.tiers, or remove hedge",
            field_path=".hedge",
            check=lambda c: not c.hedge or len(c.tiers) > 0,
        ),
        Rule(
            cel="self.confidence == 'MinWindowProbability' || "
            f"self.windowTokens == {WINDOW_TOKENS}",
            message="cascade.windowTokens is the window of confidence MinWindowProbability, and "
            "cascade.confidence is MeanProbability (its default): set confidence: "
            "MinWindowProbability, or remove windowTokens",
            field_path=".windowTokens",
            check=lambda c: (
                c.confidence == ConfidenceMethod.MIN_WINDOW_PROBABILITY
                or c.window_tokens == WINDOW_TOKENS
            ),
            ratchets=True,
        ),
    )


class DegradationSpec(ApiModel):
    enabled: bool = False
    """When this service's pool is saturated, send sheddable requests to a cheaper service (or
    answer them 429 when there is none) instead of queueing them behind critical traffic."""
    service: ServiceName | None = None
    """The cheaper InferenceService (same namespace); default: the first cascade tier."""
    max_queue_depth: Annotated[float, Field(ge=0, le=100_000)] = 4
    """Saturated when the pool's engines have more waiting requests than this, on average."""
    max_kv_cache_usage: Annotated[float, Field(gt=0, le=1)] | None = None
    """Saturated when the pool's mean KV-cache usage is above this (default:
    `slo.maxKvCacheUsage`)."""

    rules = (
        Rule(
            cel="self.enabled || (!has(self.service) && !has(self.maxKvCacheUsage) && "
            "double(self.maxQueueDepth) == 4.0)",
            message="degradation.service, maxQueueDepth and maxKvCacheUsage act only while "
            "degradation.enabled is true (false by default): set enabled: true, or remove them",
            field_path=".enabled",
            check=lambda d: (
                d.enabled
                or (d.service is None and d.max_kv_cache_usage is None and d.max_queue_depth == 4)
            ),
            ratchets=True,
        ),
    )


class LimitsSpec(ApiModel):
    max_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS)] | None = None
    """Cap on `max_tokens` per request."""
    timeout_seconds: Annotated[float, Field(gt=0, le=3600)] | None = None
    """Per-request timeout at the gateway."""
    requests_per_minute: Annotated[int, Field(ge=1, le=MAX_EXACT_INTEGER)] | None = None
    """Per-tenant request rate limit."""
    tokens_per_minute: Annotated[int, Field(ge=1, le=MAX_EXACT_INTEGER)] | None = None
    """Per-tenant token rate limit."""
    partial_answers: bool = False
    """A non-streaming request that reaches `timeoutSeconds` gets what was generated so far
    (`finish_reason: "length"`, header `x-llmfleet-truncated: timeout`) instead of a 504."""

    rules = (
        Rule(
            cel="!self.partialAnswers || has(self.timeoutSeconds)",
            message="limits.partialAnswers acts at limits.timeoutSeconds: set timeoutSeconds, or "
            "remove partialAnswers",
            field_path=".partialAnswers",
            check=lambda lim: not lim.partial_answers or lim.timeout_seconds is not None,
        ),
    )


class TrafficSpec(ApiModel):
    coalesce: CoalesceSpec = Field(default_factory=CoalesceSpec)
    """Request coalescing."""
    debounce: DebounceSpec = Field(default_factory=DebounceSpec)
    """Request debouncing per session."""
    cascade: CascadeSpec = Field(default_factory=CascadeSpec)
    """Model cascading: cheaper tiers first."""
    degradation: DegradationSpec = Field(default_factory=DegradationSpec)
    """Load-based degradation of sheddable traffic to a cheaper service."""
    limits: LimitsSpec = Field(default_factory=LimitsSpec)
    """Timeouts, token caps and rate limits."""

    rules = (
        Rule(
            cel="!has(self.degradation) || !self.degradation.enabled || "
            "has(self.degradation.service) || "
            "(has(self.cascade) && has(self.cascade.tiers) && size(self.cascade.tiers) > 0)",
            message="degradation needs a cheaper service: degradation.service or a cascade tier",
            field_path=".degradation.service",
            reason="FieldValueRequired",
            check=lambda t: (
                not t.degradation.enabled
                or t.degradation.service is not None
                or len(t.cascade.tiers) > 0
            ),
        ),
        Rule(
            cel="!has(self.debounce) || self.debounce.mode != 'LatestWins' || !has(self.limits) "
            "|| !has(self.limits.timeoutSeconds) || "
            "self.limits.timeoutSeconds * 1000.0 > double(self.debounce.delayMs)",
            message="limits.timeoutSeconds must be longer than debounce.delayMs (5 ms by "
            "default), which LatestWins holds every request for: raise timeoutSeconds or lower "
            "delayMs",
            field_path=".limits.timeoutSeconds",
            check=lambda t: (
                t.debounce.mode != DebounceMode.LATEST_WINS
                or t.limits.timeout_seconds is None
                or t.limits.timeout_seconds * 1000 > t.debounce.delay_ms
            ),
        ),
    )


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
    max_latency_ratio: Annotated[float, Field(ge=1, le=100)] = 1.5
    """Roll back when the canary's TTFT or ITL p95 is more than this many times the stable
    revision's, measured over the same window (checked once the stable revision has served
    `minRequests` in it too)."""
    min_requests: Annotated[int, Field(ge=1, le=1_000_000)] = 50
    """Requests the canary must have served within an interval before any verdict; with fewer
    the rollout waits (and says so in `status.canary`) instead of deciding."""


PROGRESS_DEADLINE_SECONDS = 1800
"""`rollout.progressDeadlineSeconds` by default (its rule refuses another value without Canary)."""


class RolloutSpec(ApiModel):
    strategy: RolloutStrategy = RolloutStrategy.ROLLING_UPDATE
    """`RollingUpdate` replaces pods in place; `Canary` shifts traffic by steps with analysis."""
    steps: Annotated[list[CanaryStep], Field(max_length=20)] = []
    """Canary steps, weights rising."""
    analysis: AnalysisSpec = Field(default_factory=AnalysisSpec)
    """SLO analysis that promotes or rolls back a canary."""
    progress_deadline_seconds: Annotated[int, Field(ge=60, le=86400)] = PROGRESS_DEADLINE_SECONDS
    """How long the canary's pods may take to serve a step's weight (promoting: the whole
    target) before the canary is rolled back (`CanaryProgressDeadlineExceeded`): pods that never
    turn Ready (a crash loop, no GPU left) must not hold a rollout forever. The default is the
    launcher's own start-up limit; keep it above a cold start of the model."""

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
        Rule(
            cel="self.strategy == 'Canary' || size(self.steps) == 0",
            message="rollout.steps are a canary's, and rollout.strategy is RollingUpdate (its "
            "default): set strategy: Canary, or remove steps",
            field_path=".steps",
            check=lambda r: r.strategy == RolloutStrategy.CANARY or not r.steps,
            ratchets=True,
        ),
        Rule(
            cel="self.strategy == 'Canary' || !has(self.analysis)",
            message="rollout.analysis judges a canary, and rollout.strategy is RollingUpdate (its "
            "default): set strategy: Canary, or remove analysis",
            field_path=".analysis",
            check=lambda r: (
                r.strategy == RolloutStrategy.CANARY or "analysis" not in r.model_fields_set
            ),
            ratchets=True,
        ),
        Rule(
            cel="self.strategy == 'Canary' || "
            f"self.progressDeadlineSeconds == {PROGRESS_DEADLINE_SECONDS}",
            message="rollout.progressDeadlineSeconds limits a canary's steps, and "
            "rollout.strategy is RollingUpdate (its default): set strategy: Canary, or remove "
            "progressDeadlineSeconds",
            field_path=".progressDeadlineSeconds",
            check=lambda r: (
                r.strategy == RolloutStrategy.CANARY
                or r.progress_deadline_seconds == PROGRESS_DEADLINE_SECONDS
            ),
            ratchets=True,
        ),
    )
