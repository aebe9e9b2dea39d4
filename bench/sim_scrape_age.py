"""What the age of the engines' scraped figures costs in routing quality (issue 28), measured
with the fleet simulator (`llmfleet sim`) on both public traces (`data/traces/`).

The gateway routes on its own in-flight counts (exact, current) and on each engine's queue,
batch and KV usage, which it scrapes. This replays each trace with those scraped figures
refreshed every S seconds (`SimSettings.scrape_s`): S = 0 is the idealized gateway the simulator
modelled so far (read at the moment of routing), 1 s the gateway's default interval, 5 s and
15 s slower ones, "never" the in-flight counts alone. Each at 1, 2 (the chart's default) and 4
gateway replicas (`SimSettings.gateway_replicas`): a replica counts only its own requests in
flight, so the scraped figures are what tells it about the others'.

Two fleets per setting, with the CLI's defaults (the traces' SLOs, `prefix-load` routing, cold
start 90 s):
- `llmfleet`: our autoscaling policy (no warm spare, its own floor): attainment and GPU-hours,
  as routing quality feeds back into the latencies it scales on;
- `fixed N`: the static-peak fleet of that trace (the smallest fixed fleet meeting 99% with
  S = 0 and one replica): the same GPU-hours throughout, so the attainment is routing alone.

    nice -n 10 .venv/bin/python bench/sim_scrape_age.py > bench/results/issue28-scrape-age.txt

About a minute on one core. The figures depend on the two traces: Azure's code trace (short 2k-token
prompts, bursty) and Mooncake's synthetic one (long prompts, shared prefixes, Poisson arrivals).
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

from llmfleet.autoscaler.sim.baselines import StaticPeak
from llmfleet.autoscaler.sim.cli import SLO_DEFAULTS
from llmfleet.autoscaler.sim.compare import Options, PolicyMetrics, compare, metrics
from llmfleet.autoscaler.sim.model import EngineModel
from llmfleet.autoscaler.sim.run import SimSettings, Slo, simulate
from llmfleet.autoscaler.sim.traces import Trace, load, shipped

AGES = (0.0, 1.0, 5.0, 15.0, math.inf)
REPLICAS = (1, 2, 4)
OPTIONS = Options(warm_spares=0, min_replicas=None, max_replicas=64)
"""The CLI's defaults (`llmfleet sim` with no option)."""


def _age(seconds: float) -> str:
    if seconds == 0:
        return "0 (ideal)"
    return "never" if math.isinf(seconds) else f"{seconds:g} s"


def _row(label: str, age: float, replicas: int, m: PolicyMetrics) -> str:
    return (
        f"  {label:<10} {_age(age):>9} {replicas:>8}  {m.ttft_attainment:7.2f} "
        f"{m.itl_attainment:7.2f} {m.gpu_hours:6.2f}  {m.ttft_p95_ms:8.0f} {m.ttft_p99_ms:8.0f} "
        f"{m.itl_p95_ms:7.1f} {100 * m.prefix_hit_share:6.1f}%"
    )


def _trace(trace: Trace) -> None:
    ttft, itl = SLO_DEFAULTS[trace.kind]
    base = SimSettings(
        slo=Slo(ttft, itl), model=replace(EngineModel(), cold_start_s=90.0).for_slo(itl)
    )
    static = compare(trace, base, OPTIONS, ["static-peak"]).static_replicas
    print(
        f"{trace.name}: {len(trace.requests)} requests over {trace.duration / 60:.0f} min; SLO "
        f"TTFT <= {ttft:g} ms, ITL <= {itl:g} ms; fixed fleet: {static} replicas"
    )
    print(
        "  fleet      scrape    gateways  TTFT ok  ITL ok  GPU-h  TTFT p95 TTFT p99 ITL p95  prefix"
    )
    for fleet in ("llmfleet", f"fixed {static}"):
        for replicas in REPLICAS:
            for age in AGES:
                settings = replace(base, scrape_s=age, gateway_replicas=replicas)
                if fleet == "llmfleet":
                    m = compare(trace, settings, OPTIONS, ["llmfleet"]).metrics[0]
                else:
                    m = metrics(simulate(trace, StaticPeak(static), settings), settings, None)
                print(_row(fleet, age, replicas, m), flush=True)


def main() -> None:
    started = time.perf_counter()
    print(
        "Scraped figures' age against routing quality (prefix-load routing; attainment in % of "
        "requests, TTFT and ITL in ms). Rows: fleet, how old the scraped figures may be, "
        "gateway replicas.\n"
    )
    for path in shipped():
        _trace(load(path))
        print()
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
