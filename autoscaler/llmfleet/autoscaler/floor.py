"""The lowest serving count of a pool: the user's minReplicas, or, when unset, one the policy
chooses from availability and the load it has measured.

A pool whose `minReplicas` is unset keeps `PolicyConfig.unset_min_replicas` (2) serving: one
pod's failure or the first burst of a service the policy knows nothing about yet then still
meets a serving replica, not a cold start. It drops to 1 only once the pool is measured light:
no decision has needed `unset_min_replicas` or more for `light_after_s` (30 min), nor for twice
the longest lull seen between two such needs (the quiet before the first one included). A
service whose bursts recur every twenty minutes thus keeps its floor through the lulls, while
one that a single replica has served all along (a light chat service, a model few teams call)
stops paying for a second GPU. The first need of two or more raises the floor again at once.
The memory is written to `status.autoscaling.pools.*.floorMemory` (`decision.floor_memory`) and
read back by a restarted autoscaler (`decision.remembered`); a pool without it starts at the
safe floor.

NOTE: a warm spare instead of the second serving pod (1 + 1) holds the same GPU, so it is no
cheaper; it only serves later. What saves GPU-hours is running one pod where one suffices.

Pure and clock-free: the caller passes the signals' time and the need it sized.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from llmfleet.autoscaler.inputs import PolicyConfig, PoolState
from llmfleet.crds.spec import PoolSpec


@dataclass(frozen=True)
class Floor:
    replicas: int
    why: str
    """For the reason string: where the floor comes from."""


def floor(
    pool_spec: PoolSpec,
    state: PoolState,
    need: int,
    observed_at: datetime,
    config: PolicyConfig,
) -> tuple[Floor, PoolState]:
    """The pool's floor for a decision whose load needs `need` replicas at `observed_at`, and
    the state with the load's memory updated (emptied when the user set minReplicas: should it
    be unset again, the policy measures afresh)."""
    if pool_spec.min_replicas is not None:
        forgotten = replace(state, observed_since=None, busy_at=None, longest_lull_s=0.0)
        return Floor(pool_spec.min_replicas, f"minReplicas {pool_spec.min_replicas}"), forgotten
    default = config.unset_min_replicas
    since = state.observed_since or observed_at
    lull = state.longest_lull_s
    busy_at = state.busy_at
    if need >= default:
        # The quiet before the first such need counts too: it is how long this pool's load
        # went without one.
        lull = max(lull, (observed_at - (busy_at or since)).total_seconds())
        busy_at = observed_at
    remembered = replace(state, observed_since=since, busy_at=busy_at, longest_lull_s=lull)
    quiet_s = (observed_at - (busy_at or since)).total_seconds()
    required_s = max(config.light_after_s, 2.0 * lull)
    if quiet_s >= required_s and default > 1:
        why = (
            f"floor 1 (minReplicas unset; measured light: nothing needed {default} for "
            f"{quiet_s / 60:.0f} min)"
        )
        return Floor(1, why), remembered
    why = (
        f"default floor {default} (minReplicas unset; 1 once nothing needs {default} for "
        f"{required_s / 60:.0f} min, {quiet_s / 60:.0f} so far)"
    )
    return Floor(default, why), remembered
