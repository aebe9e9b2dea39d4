"""The contract between the simulated fleet and whatever sizes it (our policy or a baseline)."""

from __future__ import annotations

from typing import Protocol

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
