"""From what each request saw to the figures `llmfleet load` reports: pure, no I/O.

- TTFT: from sending the request to its first chunk with generated text, over answered
  requests; p50/p95/p99 by linear interpolation (numpy's default, as `llmfleet sim`).
- ITL: the gaps between successive chunks with text, all requests' gaps pooled. The client
  sees what reached it: chunks that arrive in one read count a gap near 0, so ITL is a
  client-side figure, not the engine's step time.
- Attainment (as `llmfleet sim` counts it): TTFT, the share of sent requests answered with a
  TTFT within the target; ITL, the share answered whose mean gap (TPOT) is within the target
  (one chunk: no gap, within). A failed request misses both. Dropped requests were never
  sent and are not in the denominator; they show as their own count and error kind.
- Send lag: how late each request left against its planned time (the replay's own fidelity;
  a large lag means this client, not the service, was the bottleneck).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

DROPPED = "dropped: concurrency cap"
"""The error kind of a request not sent because --concurrency requests were in flight."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """One planned request, as the client saw it."""

    index: int
    scheduled_s: float
    """Planned send time, seconds after the replay started."""
    sent_s: float | None
    """When it was sent (None: dropped, never sent)."""
    error: str | None = None
    """The error kind (`http 429 rate_limit_error`, `timeout`, …); None when answered."""
    ttft_s: float | None = None
    gaps_s: tuple[float, ...] = ()
    """Seconds between successive chunks with text."""
    output_tokens: int = 0
    """Completion tokens the answer's usage reports (else its chunks with text)."""
    prompt_tokens: int = 0
    """Prompt tokens the trace asked for."""
    prompt_tokens_counted: int | None = None
    """Prompt tokens the engine counted (the answer's usage), when it said."""

    @property
    def ok(self) -> bool:
        return self.sent_s is not None and self.error is None


@dataclass(frozen=True)
class Slo:
    ttft_ms: float | None = None
    itl_ms: float | None = None


@dataclass(frozen=True)
class Percentiles:
    p50: float
    p95: float
    p99: float


@dataclass(frozen=True)
class Summary:
    planned: int
    sent: int
    ok: int
    failed: int
    dropped: int
    wall_s: float
    """From the replay's start to its last answer."""
    output_tokens: int
    ttft_ms: Percentiles | None
    """None when no request was answered."""
    itl_ms: Percentiles | None
    """None when no answer had two chunks with text."""
    slo: Slo
    ttft_attainment_pct: float | None
    """None without a TTFT target or with nothing sent."""
    itl_attainment_pct: float | None
    errors: dict[str, int]
    """Count per error kind, the most frequent first (dropped requests included)."""
    send_lag_ms: Percentiles | None
    prompt_token_ratio: float | None
    """Prompt tokens the engine counted over those the trace asked (answers with usage)."""

    @property
    def requests_per_s(self) -> float:
        return self.ok / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0


def percentiles(values: list[float], scale: float = 1.0) -> Percentiles | None:
    if not values:
        return None
    p50, p95, p99 = np.percentile(np.asarray(values) * scale, [50, 95, 99])
    return Percentiles(float(p50), float(p95), float(p99))


def summarize(outcomes: list[Outcome], slo: Slo, wall_s: float) -> Summary:
    sent = [o for o in outcomes if o.sent_s is not None]
    answered = [o for o in sent if o.ok]
    ttfts = [o.ttft_s for o in answered if o.ttft_s is not None]
    gaps = [gap for o in answered for gap in o.gaps_s]
    errors = Counter(o.error for o in outcomes if o.error is not None)
    counted = [o for o in answered if o.prompt_tokens_counted is not None]
    asked = sum(o.prompt_tokens for o in counted)
    return Summary(
        planned=len(outcomes),
        sent=len(sent),
        ok=len(answered),
        failed=len(sent) - len(answered),
        dropped=len(outcomes) - len(sent),
        wall_s=wall_s,
        output_tokens=sum(o.output_tokens for o in answered),
        ttft_ms=percentiles(ttfts, 1000),
        itl_ms=percentiles(gaps, 1000),
        slo=slo,
        ttft_attainment_pct=_attainment(sent, slo.ttft_ms, _ttft_within),
        itl_attainment_pct=_attainment(sent, slo.itl_ms, _itl_within),
        errors=dict(sorted(errors.items(), key=lambda item: (-item[1], item[0]))),
        send_lag_ms=percentiles(
            [max(0.0, o.sent_s - o.scheduled_s) for o in sent if o.sent_s is not None], 1000
        ),
        prompt_token_ratio=(
            sum(o.prompt_tokens_counted or 0 for o in counted) / asked if asked else None
        ),
    )


def _ttft_within(outcome: Outcome, target_s: float) -> bool:
    return outcome.ttft_s is not None and outcome.ttft_s <= target_s


def _itl_within(outcome: Outcome, target_s: float) -> bool:
    if not outcome.gaps_s:
        return True
    return sum(outcome.gaps_s) / len(outcome.gaps_s) <= target_s


def _attainment(
    sent: list[Outcome], target_ms: float | None, within: Callable[[Outcome, float], bool]
) -> float | None:
    if target_ms is None or not sent:
        return None
    met = sum(1 for o in sent if o.ok and within(o, target_ms / 1000))
    return 100.0 * met / len(sent)
