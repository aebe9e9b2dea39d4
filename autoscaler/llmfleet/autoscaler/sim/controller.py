"""The contract between the simulated fleet and whatever sizes it (our policy or a baseline)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from llmfleet.autoscaler.sim.observe import Observation


class Controller(Protocol):
    name: str
    """Row label in the report."""

    def start(self) -> tuple[int, int]:
        """(active, spares) the pool runs at the trace's start."""
        ...

    def decide(self, observation: Observation) -> tuple[int, int]:
        """(active, spares) after a tick; called every tick, acting at its own interval."""
        ...


@runtime_checkable
class FastPath(Protocol):
    """A controller that also looks every `fast_interval_s` between its ticks (our policy's
    fast pass on fresh gauges; `policy.decide_fast`). The baselines have none: their systems
    act on their own polling intervals."""

    fast_interval_s: float

    def decide_fast(self, observation: Observation) -> tuple[int, int]:
        """(active, spares) after a fast look: the same or more active replicas."""
        ...
