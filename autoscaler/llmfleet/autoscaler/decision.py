"""The policy's answer: counts and a reason per pool, and `status.autoscaling` made from them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from llmfleet.autoscaler.inputs import PolicyState
from llmfleet.crds.inference_service import AutoscalingPoolDecision, AutoscalingStatus


@dataclass(frozen=True)
class PoolDecision:
    active: int
    spares: int
    reason: str
    limited: str = ""
    """Why this pool could not have what it needs; empty when it could."""
    floor: int | None = None
    """The lowest serving count this decision allowed (minReplicas, or the policy's own when
    it is unset: `floor.py`); None when the pool was held without sizing it."""


@dataclass(frozen=True)
class Decision:
    pools: dict[str, PoolDecision]
    state: PolicyState
    """Pass to the next `decide`."""
    decided_at: datetime

    @property
    def limited(self) -> bool:
        return any(p.limited for p in self.pools.values())

    @property
    def message(self) -> str:
        return "; ".join(f"{n}: {p.limited}" for n, p in self.pools.items() if p.limited)

    def status(self) -> AutoscalingStatus:
        """`status.autoscaling` as the operator reads it."""
        return AutoscalingStatus(
            pools={
                name: AutoscalingPoolDecision(
                    active=p.active, spares=p.spares, reason=p.reason[:1024]
                )
                for name, p in self.pools.items()
            },
            last_decision_time=self.decided_at.astimezone(UTC).isoformat().replace("+00:00", "Z"),
            limited=self.limited,
            message=self.message[:4096],
        )
