"""Goodput: the share of a window's requests over a latency target, from histogram buckets, and
what that share says about the capacity model.

A latency histogram arrives as Prometheus keeps it: cumulative counts per upper bound `le`
(`LatencyHistogram`, the window's `increase()` of each `_bucket` series). The requests within a
bound are the count at its `le`; the share over it is 1 - that / the total.

NOTE: a target that is not a bucket boundary (2 s between vLLM's 1.0 and 2.5 s TTFT buckets)
cannot be read exactly: a request in that bucket may be on either side. Interpolating inside the
bucket (`histogram_quantile`'s assumption of an even spread) invents misses: a pool whose TTFTs
sit just above 1 s shows a third of that bucket "over 2 s" when none is. So each reading rounds
the way that cannot mislead the policy:
- misses (which cut the correction) are the requests over the *next* boundary at or above the
  target (`over(h, t)`, `Round.UP`): certain misses only (over 2.5 s for a 2 s target);
- comfort (which lets it recover) is read at the *previous* boundary at or below the comfortable
  latency (`Round.DOWN`): only requests certainly below it count as comfortable.
The price is a blind spot: requests between the target and the next boundary (2.0-2.5 s) are
neither misses nor comfortable, so the correction holds there. Put SLO targets on bucket
boundaries (vLLM's TTFT buckets include 0.5, 1, 2.5, 5, 10 s) to remove it; the sizing model
still plans for the exact target either way.

From share to correction (`implied_ratio`). The policy's correction is a factor on a replica's
capacity, learnt as target / observed latency at the SLO's percentile. A share over the target
gives that ratio once the tail's shape is assumed: for an exponential tail (the M/M/1 response
time the sizing model plans with) P(T > t) = exp(-t / m), so the share s over the target R puts
the mean at m = R / ln(1/s), and the percentile q = 1 - a the SLO holds for at
ln(1/a) x m = R x ln(1/a) / ln(1/s). Target over that percentile is ln(1/s) / ln(1/a): 1 when
the share is exactly the allowed a, 0.85 for 2% over a 1% allowance, 0.5 for 10%.

Misses more replicas would not remove (`capacity_misses`). A prompt whose prefill alone takes
longer than the TTFT target misses it on an idle engine; such misses say nothing about the
capacity model, yet a light window of 25 requests with two of them would cut the correction by
a fifth and keep the pool oversized for ten minutes. vLLM's prefill-time histogram
(`vllm:request_prefill_time_seconds`) counts them: a request whose prefill phase is over a
boundary has a TTFT over it too (TTFT = queue + prefill), so reading both at the same boundary
(the TTFT's, or the next prefill boundary above it) and subtracting removes only requests the
TTFT count holds, and from the total as well. NOTE: with chunked prefill a prompt's prefill
phase also stretches when the engine is busy, so a few of the requests subtracted in an
overloaded window are capacity misses; the queue it built still shows in the others. vLLM
observes the prefill time when a request finishes, so a window may hold a request's prefill time
and not its TTFT: the difference is clamped at zero.

A handful of requests must not move it (one slow request of ten is a 10% share): the share used
for a cut is the lower bound of its Wilson score interval (one-sided, `z`), so a cut needs
evidence beyond chance, and a window with few requests cuts little or not at all.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from enum import Enum


class Round(Enum):
    """Which bucket boundary stands for a latency that is not one (module docstring)."""

    UP = "up"
    DOWN = "down"


@dataclass(frozen=True)
class LatencyHistogram:
    """Cumulative request counts per upper bound (seconds), as Prometheus buckets hold them."""

    bounds: tuple[float, ...]
    """Upper bounds `le` in increasing order; the last is +Inf."""
    counts: tuple[float, ...]
    """Requests with a latency at or below each bound (the last: all of them)."""

    def __post_init__(self) -> None:
        if len(self.bounds) != len(self.counts) or not self.bounds:
            raise ValueError("a histogram needs one count per bound, and at least one bound")
        if self.bounds[-1] != math.inf:
            raise ValueError(f"the last bound must be +Inf, got {self.bounds[-1]}")

    @property
    def total(self) -> float:
        return self.counts[-1]

    def invalid(self) -> str:
        """Why these counts are no histogram (NaN, negative, not cumulative), or ""."""
        if not all(math.isfinite(c) and c >= 0 for c in self.counts):
            return f"counts {list(self.counts)}"
        # NOTE: increase() extrapolates each series on its own, so cumulative counts may dip by
        # float noise; a real dip (a reset inside the window) is more than that.
        if any(b < a - 1e-6 * max(a, 1.0) for a, b in itertools.pairwise(self.counts)):
            return f"counts not cumulative {list(self.counts)}"
        return ""

    def within(self, latency_s: float, rounding: Round) -> tuple[float, float]:
        """(requests at or below the boundary standing for `latency_s`, that boundary)."""
        below, at = 0.0, 0.0
        for bound, count in zip(self.bounds, self.counts, strict=True):
            if bound == latency_s or (bound > latency_s and rounding is Round.UP):
                return count, bound
            if bound > latency_s:
                return below, at
            below, at = count, bound
        return below, at

    def quantile(self, q: float) -> float | None:
        """The `q` quantile in seconds as PromQL's `histogram_quantile` computes it from these
        buckets (Prometheus 2.42 `bucketQuantile`: counts made monotonic, linear interpolation
        inside the bucket the rank falls in, the lowest bucket starting at 0, a rank in the +Inf
        bucket the highest finite bound); None where PromQL says NaN (no requests, only the +Inf
        bucket). A quantile of `increase()` buckets is that of their `rate()`: the scale cancels."""
        counts = list(itertools.accumulate(self.counts, max))
        if len(counts) < 2 or not counts[-1] > 0:
            return None
        rank = q * counts[-1]
        b = next((i for i, c in enumerate(counts[:-1]) if c >= rank), len(counts) - 1)
        if b == len(counts) - 1:
            return self.bounds[-2]
        if b == 0 and self.bounds[0] <= 0:
            return self.bounds[0]
        start, end, count = 0.0, self.bounds[b], counts[b]
        if b > 0:
            start, count, rank = self.bounds[b - 1], count - counts[b - 1], rank - counts[b - 1]
        return start + (end - start) * (rank / count)

    @classmethod
    def of(
        cls, samples: list[float] | tuple[float, ...], bounds: tuple[float, ...]
    ) -> LatencyHistogram:
        """The histogram of `samples` (seconds) over finite `bounds` (+Inf is appended)."""
        ordered = sorted(samples)
        counts: list[float] = []
        i = 0
        for bound in bounds:
            while i < len(ordered) and ordered[i] <= bound:
                i += 1
            counts.append(float(i))
        return cls((*bounds, math.inf), (*counts, float(len(ordered))))


@dataclass(frozen=True)
class Over:
    """Requests of a window over a bucket boundary."""

    over: float
    total: float
    bound_s: float
    """The boundary read (the target itself, or the boundary `Round` picked for it)."""
    prefill_bound: float = 0.0
    """Requests left out of `over` and `total` as prefill-bound (`capacity_misses`)."""

    @property
    def share(self) -> float:
        return self.over / self.total if self.total > 0 else 0.0


def over(histogram: LatencyHistogram, latency_s: float, rounding: Round = Round.UP) -> Over:
    total = histogram.total
    within, bound = histogram.within(latency_s, rounding)
    return Over(max(total - within, 0.0), total, bound)


def capacity_misses(ttft: Over, prefill: LatencyHistogram | None) -> Over:
    """`ttft` (requests over a TTFT boundary) without those whose prefill phase alone was over
    it (module docstring); `ttft` itself when the engine exports no prefill histogram."""
    if prefill is None or prefill.total <= 0:
        return ttft
    bound_s = ttft.bound_s
    if bound_s <= 0 or math.isinf(bound_s):
        return ttft
    own = over(prefill, bound_s, Round.UP)
    removed = min(own.over, ttft.over)
    return Over(ttft.over - removed, max(ttft.total - removed, 0.0), bound_s, removed)


def wilson_lower(over: Over, z: float) -> float:
    """Lower bound of the Wilson score interval of the share (0 with no requests)."""
    n = over.total
    if n <= 0:
        return 0.0
    p = min(max(over.over / n, 0.0), 1.0)
    z2 = z * z
    centre = p + z2 / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return max((centre - spread) / (1 + z2 / n), 0.0)


def implied_ratio(share: float, allowed: float) -> float:
    """Target / latency at the SLO's percentile implied by `share` over the target, under an
    exponential tail (module docstring): ln(1/share) / ln(1/allowed); >= 1 when within."""
    if share <= 0.0:
        return math.inf
    if share >= 1.0:
        return 0.0
    return math.log(1.0 / share) / math.log(1.0 / allowed)
