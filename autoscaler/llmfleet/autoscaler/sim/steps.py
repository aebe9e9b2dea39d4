"""Load steps and the time each policy takes to reach the capacity a step needs.

"To capacity" is the time from a load step to the serving capacity the step needs:
- the need of a moment is what the policy's sizing (`profile.replicas_for`, p95 headroom, no
  correction) asks for the trace's arrivals in the minute from it, every tick;
- a step is a moment whose need exceeds every need of the `lookback_s` before it (capacity the
  pool had no reason to hold); its size is that excess, and the largest step (the earliest of
  equals) is the one reported;
- a policy reaches it when as many pods serve as the step needs, read from the pool's own log of
  serving pods (the moment a pod serves, not the next tick): 0 s when they already did, None when
  not within `horizon_s`.

The first minute is no step: every policy starts with a fleet sized for it (`compare`). A trace
without a step (a steady load, or one whose highest need is at its start) reports none rather
than a figure that measures nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

LOOKBACK_S = 300.0
HORIZON_S = 600.0


@dataclass(frozen=True)
class Step:
    start: float
    """Seconds into the trace: the start of the minute whose need rose."""
    need: int
    """Serving replicas the minute needs."""
    before: int
    """The highest need of the lookback before it."""


def largest_step(
    starts: list[float], needs: list[int], step_s: float, lookback_s: float = LOOKBACK_S
) -> Step | None:
    """The step with the largest rise over the lookback's highest need; None without one."""
    back = max(int(lookback_s / step_s), 1)
    best: Step | None = None
    for i, need in enumerate(needs[1:], start=1):
        before = max(needs[max(0, i - back) : i])
        if need > before and (best is None or need - before > best.need - best.before):
            best = Step(starts[i], need, before)
    return best


def time_to_capacity(
    serving_log: list[tuple[float, int]], step: Step, horizon_s: float = HORIZON_S
) -> float | None:
    """Seconds from the step until `step.need` pods serve (0 when they did already)."""
    at_start = next((count for t, count in reversed(serving_log) if t <= step.start), 0)
    if at_start >= step.need:
        return 0.0
    for t, count in serving_log:
        if step.start < t <= step.start + horizon_s and count >= step.need:
            return t - step.start
    return None
