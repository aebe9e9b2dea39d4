"""The SLO-aware autoscaler and the fleet simulator (issue 6).

Today: the pure policy. `decide(ServiceInputs, PolicyState, now) -> Decision`; the decision's
`status()` is what `status.autoscaling` takes.
"""

from llmfleet.autoscaler.decision import Decision, PoolDecision
from llmfleet.autoscaler.inputs import (
    PolicyConfig,
    PolicyState,
    PoolInputs,
    PoolPods,
    PoolSignals,
    PoolState,
    ServiceInputs,
)
from llmfleet.autoscaler.policy import decide

__all__ = [
    "Decision",
    "PolicyConfig",
    "PolicyState",
    "PoolDecision",
    "PoolInputs",
    "PoolPods",
    "PoolSignals",
    "PoolState",
    "ServiceInputs",
    "decide",
]
