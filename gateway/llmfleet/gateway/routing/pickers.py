"""Pickers `max-score` and `round-robin`.

max-score:   the candidate with the highest weighted score; ties go to the fewest in-flight
             requests, then to a random one (seeded `random.Random`, so tests can fix it).
round-robin: candidates in turn, ignoring scores (the comparison baseline); the counter is per
             picker instance, and the scheduler keeps one per pool.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from llmfleet.gateway.routing.base import Candidate

_EPSILON = 1e-9


class MaxScorePicker:
    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def pick(self, candidates: Sequence[Candidate], scores: Sequence[float]) -> Candidate:
        best = max(scores)
        tied = [c for c, s in zip(candidates, scores, strict=True) if s >= best - _EPSILON]
        fewest = min(c.in_flight for c in tied)
        tied = [c for c in tied if c.in_flight == fewest]
        return tied[0] if len(tied) == 1 else self._rng.choice(tied)


class RoundRobinPicker:
    def __init__(self) -> None:
        self._next = 0

    def pick(self, candidates: Sequence[Candidate], scores: Sequence[float]) -> Candidate:
        chosen = candidates[self._next % len(candidates)]
        self._next += 1
        return chosen
