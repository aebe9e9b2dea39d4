"""`llmfleet load`: replay a request trace against the gateway's OpenAI API in open loop and
measure TTFT and ITL as a client sees them (issue 12 item 5).

Modules: `plan` (send times and prompts from a trace: pure), `stats` (per-request outcomes to
percentiles, SLO attainment and errors by kind: pure), `replay` (the open-loop sender over
httpx), `report` (the summary table and JSON), `slo` (a service's SLO from the cluster),
`run` (one run: progress and output), `cli`.
"""

DEFAULT_GATEWAY_URL = "http://127.0.0.1:8080"
"""Where `llmfleet load` finds the gateway unless `--gateway` or `LLMFLEET_GATEWAY_URL` says."""
GATEWAY_URL_ENV = "LLMFLEET_GATEWAY_URL"
