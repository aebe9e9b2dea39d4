"""The SLO-aware autoscaler and the fleet simulator (DESIGN.md §7).

- `policy.decide(ServiceInputs, PolicyState, now) -> Decision`: pure; the decision's `status()`
  is what `status.autoscaling` takes (sizing in `sizing.py`/`capacity.py`, forecast in
  `forecast.py`, the GPU budget in `budget.py`);
- `signals.PrometheusSignals`: every pool's `PoolSignals` in one PromQL query per chunk of
  services (`QUERY_CHUNK_SERVICES`, 100: one query up to that many);
- `loop.Autoscaler`: one pass of pods + signals -> policy -> status patch (`kube.py`), run by
  `cli.py` (`llmfleet autoscaler`);
- `sim/`: `llmfleet sim`, the trace-driven fleet simulator that runs the same `decide`.
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
