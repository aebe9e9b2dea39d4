"""Plugins by name, and the pipeline a profile builds from them.

Adding a plugin is one module plus one line here; profiles in the settings refer to the names.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from llmfleet.gateway.routing.base import Candidate, Filter, Picker, RoutingRequest, Scorer
from llmfleet.gateway.routing.healthy import HealthyFilter
from llmfleet.gateway.routing.inflight_tokens import InFlightTokensScorer
from llmfleet.gateway.routing.kv_cache import KvCacheScorer
from llmfleet.gateway.routing.least_loaded import LeastLoadedScorer
from llmfleet.gateway.routing.pickers import MaxScorePicker, RoundRobinPicker
from llmfleet.gateway.routing.prefix_affinity import PrefixAffinityScorer
from llmfleet.gateway.routing.queue_depth import QueueDepthScorer


@dataclass(frozen=True)
class PluginOptions:
    """Tunables some plugins take (from the gateway settings)."""

    bounded_load_factor: float = 1.25
    seed: int | None = None


FILTERS: Mapping[str, Callable[[PluginOptions], Filter]] = {
    "healthy": lambda _: HealthyFilter(),
}
SCORERS: Mapping[str, Callable[[PluginOptions], Scorer]] = {
    "prefix-affinity": lambda o: PrefixAffinityScorer(o.bounded_load_factor),
    "queue-depth": lambda _: QueueDepthScorer(),
    "kv-cache": lambda _: KvCacheScorer(),
    "inflight-tokens": lambda _: InFlightTokensScorer(),
    "least-loaded": lambda _: LeastLoadedScorer(),
}
PICKERS: Mapping[str, Callable[[PluginOptions], Picker]] = {
    "max-score": lambda o: MaxScorePicker(random.Random(o.seed)),
    "round-robin": lambda _: RoundRobinPicker(),
}


T = TypeVar("T")


class UnknownPluginError(ValueError):
    pass


def _lookup(
    table: Mapping[str, Callable[[PluginOptions], T]], kind: str, name: str
) -> Callable[[PluginOptions], T]:
    try:
        return table[name]
    except KeyError:
        known = ", ".join(sorted(table))
        raise UnknownPluginError(f"unknown {kind} {name!r} (known: {known})") from None


class Scheduler:
    """One pipeline: filters, then the weighted sum of clamped scores, then the picker."""

    def __init__(
        self,
        filters: Sequence[Filter],
        scorers: Sequence[tuple[Scorer, float]],
        picker: Picker,
    ) -> None:
        self.filters = list(filters)
        self.scorers = list(scorers)
        self.picker = picker

    @classmethod
    def build(
        cls,
        filters: Sequence[str],
        scorers: Mapping[str, float],
        picker: str,
        options: PluginOptions | None = None,
    ) -> Scheduler:
        """The pipeline named by a profile; UnknownPluginError names a misspelt plugin."""
        opts = options or PluginOptions()
        return cls(
            [_lookup(FILTERS, "filter", name)(opts) for name in filters],
            [(_lookup(SCORERS, "scorer", name)(opts), weight) for name, weight in scorers.items()],
            _lookup(PICKERS, "picker", picker)(opts),
        )

    def pick(self, request: RoutingRequest, candidates: Sequence[Candidate]) -> Candidate | None:
        """The endpoint for `request`, or None when there is no candidate at all."""
        if not candidates:
            return None
        remaining: Sequence[Candidate] = candidates
        for plugin in self.filters:
            kept = plugin.filter(request, remaining)
            if kept:  # a filter that rejects everyone is ignored, not obeyed
                remaining = kept
        totals = [0.0] * len(remaining)
        for scorer, weight in self.scorers:
            for i, value in enumerate(scorer.score(request, remaining)):
                totals[i] += weight * min(1.0, max(0.0, value))
        return self.picker.pick(remaining, totals)
