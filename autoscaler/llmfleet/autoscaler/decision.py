"""The policy's answer: counts and a reason per pool, and `status.autoscaling` made from them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from llmfleet.autoscaler.inputs import PolicyState, PoolState
from llmfleet.crds.inference_service import (
    AutoscalingPoolDecision,
    AutoscalingStatus,
    FloorMemory,
    SloMisses,
)


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
    ttft_misses: SloMisses | None = None
    """The window's requests over the TTFT target by cause (`policy.ttft_misses`); None where
    the pool has no TTFT target, no histogram or no request in the window."""


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
                    active=p.active,
                    spares=p.spares,
                    reason=p.reason[:1024],
                    floor_memory=floor_memory(self.state.pool(name)),
                    ttft_misses=p.ttft_misses,
                )
                for name, p in self.pools.items()
            },
            last_decision_time=_rfc3339(self.decided_at),
            limited=self.limited,
            message=self.message[:4096],
        )


def floor_memory(state: PoolState) -> FloorMemory | None:
    """The part of a pool's state its floor needs across a restart (`floor.py`); None for a
    pool whose floor is the user's minReplicas (the policy keeps no such memory for it)."""
    if state.observed_since is None:
        return None
    return FloorMemory(
        observed_since=_rfc3339(state.observed_since),
        busy_at=_rfc3339(state.busy_at) if state.busy_at is not None else None,
        longest_lull_seconds=state.longest_lull_s,
    )


def remembered(status: AutoscalingStatus | None) -> PolicyState:
    """The policy state a restarted autoscaler starts from: the floors' memory written in
    `status.autoscaling`; everything else (averages, corrections, timers) starts afresh."""
    pools: dict[str, PoolState] = {}
    for name, decided in (status.pools if status else {}).items():
        memory = decided.floor_memory
        since = parse_time(memory.observed_since) if memory else None
        if memory is None or since is None:
            continue
        pools[name] = PoolState(
            observed_since=since,
            busy_at=parse_time(memory.busy_at),
            longest_lull_s=memory.longest_lull_seconds,
        )
    return PolicyState(pools)


def _rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def parse_time(value: str | None) -> datetime | None:
    """An RFC 3339 time as `status.autoscaling` holds it; None for none, for text that is not
    one, or for one without a zone (it could not be compared with the policy's clock)."""
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None
