"""`llmfleet sim`: replay a request trace through a simulated fleet driven by the real routing
plugins and the real autoscaling policy, against baseline autoscalers (issue 6 part 4).

Modules: `traces` (Azure CSV, Mooncake JSONL), `model` (engine constants and their sources),
`engine` (one vLLM engine), `fleet` (pods, spares, cold starts), `observe` (signals as
Prometheus would give them), `run` (the replay loop), `ours` and `baselines` (who sizes the
fleet), `profile` (the capacity profile and replica sizing), `compare` (all policies on one
trace), `report` (tables, JSON, plots), `cli`.
"""

POLICIES = ("llmfleet", "static-peak", "keda-inflight", "llm-d-wva", "dynamo-planner", "aibrix-kpa")
"""Our policy, then the baselines, in the order the tables show them (here, not in `compare`, so
that the CLI names them without importing the simulator)."""
