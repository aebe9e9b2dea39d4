"""`llmfleet sim TRACE...`: our policy against the five baselines, one table per trace."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from llmfleet.autoscaler.sim import POLICIES
from llmfleet.autoscaler.sim.traces import TRACES_DIR_ENV, load, shipped
from llmfleet.core.errors import UserError

# The simulator (numpy) and the plots (matplotlib) are imported by `run`, not here:
# `llmfleet --help` loads this module to list the command and must stay fast.
app = typer.Typer(add_completion=False)

SLO_DEFAULTS = {"azure": (2000.0, 50.0), "mooncake": (10_000.0, 100.0)}
"""(TTFT ms, ITL ms) per trace kind when not given: interactive code completion for Azure's
2k-token prompts; Mooncake's 15k-token (up to 190k) prompts take seconds to prefill alone."""


@app.command()
def run(
    traces: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Azure .csv or Mooncake .jsonl traces (default: the repository's data/traces/, "
            f"or ${TRACES_DIR_ENV}).",
            show_default=False,
        ),
    ] = None,
    *,
    policy: Annotated[
        list[str] | None,
        typer.Option("--policy", "-p", help=f"Only these (repeatable): {', '.join(POLICIES)}."),
    ] = None,
    ttft_ms: Annotated[
        float | None, typer.Option(help="TTFT target (ms); default 2000 Azure, 10000 Mooncake.")
    ] = None,
    itl_ms: Annotated[
        float | None, typer.Option(help="ITL (TPOT) target (ms); default 50 Azure, 100 Mooncake.")
    ] = None,
    warm_spares: Annotated[
        int,
        typer.Option(
            help="Our policy's warm spares (a spare helps once a burst is seen; these traces' "
            "bursts last seconds).",
            min=0,
        ),
    ] = 0,
    min_replicas: Annotated[
        int | None,
        typer.Option(
            help="Every autoscaling policy's minReplicas. Default: unset for ours (it keeps 2 "
            "until the load is measured light, then 1), 2 for the baselines (what a "
            "production service sets for availability).",
            min=1,
            show_default=False,
        ),
    ] = None,
    max_replicas: Annotated[int, typer.Option(help="Every policy's maxReplicas.", min=1)] = 64,
    cold_start: Annotated[float, typer.Option(help="Seconds a new pod takes to serve.", min=0)] = (
        90.0
    ),
    limit: Annotated[
        float | None, typer.Option(help="Replay only the first SECONDS of each trace.", min=1)
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    plots: Annotated[Path | None, typer.Option(help="Write PNG timelines into this dir.")] = None,
    quiet: Annotated[bool, typer.Option(help="No progress on stderr.")] = False,
    routing: Annotated[
        str,
        typer.Option(help="Gateway routing profile: prefix-load, least-loaded or round-robin."),
    ] = "prefix-load",
    scrape_seconds: Annotated[
        float,
        typer.Option(
            help="How old the engines' scraped figures the gateway routes on may be: refreshed "
            "every SECONDS (the gateway's scrape interval); 0: read at the moment of routing "
            "(idealized); inf: never (its in-flight counts only).",
            min=0,
        ),
    ] = 0.0,
    gateway_replicas: Annotated[
        int,
        typer.Option(
            help="Gateway replicas the requests are spread over, each counting only its own "
            "requests in flight.",
            min=1,
        ),
    ] = 1,
    suite: Annotated[
        str | None,
        typer.Option(
            help="robust: replay transformations of the traces instead (speed x0.5-x8, prompts "
            "x0.5/x2, idle into the busiest minute, a x4 step, a 1 h ramp, two traces together; "
            "sim/suite.py), one table each and a summary.",
        ),
    ] = None,
) -> None:
    """Replay request traces through a simulated fleet: our policy against the baselines.

    Prints SLO attainment, GPU-hours, latency tails and scaling per policy, one table per
    trace."""
    from llmfleet.autoscaler.sim import report
    from llmfleet.autoscaler.sim import suite as robust
    from llmfleet.autoscaler.sim.compare import Options, check_policies, compare
    from llmfleet.autoscaler.sim.model import EngineModel
    from llmfleet.autoscaler.sim.run import ROUTING_PROFILES, SimSettings, Slo

    names = check_policies(policy or list(POLICIES))
    _check(suite, routing, ROUTING_PROFILES)
    paths = traces or shipped()
    err = Console(stderr=True)

    def progress(message: str) -> None:
        if not quiet:
            err.print(f"sim: {message}", highlight=False)

    results = []
    out = Console()
    if not out.is_terminal:
        out = Console(width=160)
    loaded = [load(path, limit_s=limit) for path in paths]
    jobs = [(trace, trace.kind) for trace in loaded]
    if suite == "robust":
        jobs = [(m.trace, m.slo_kind) for m in robust.members(loaded, _looser)]
    comparisons = []
    for trace, slo_kind in jobs:
        ttft_default, itl_default = SLO_DEFAULTS[slo_kind]
        itl = itl_ms if itl_ms is not None else itl_default
        ttft = ttft_ms if ttft_ms is not None else ttft_default
        model = replace(EngineModel(), cold_start_s=cold_start)
        if itl > 0:
            model = model.for_slo(itl)
        settings = SimSettings(
            slo=Slo(ttft, itl),
            model=model,
            routing=routing,
            scrape_s=scrape_seconds,
            gateway_replicas=gateway_replicas,
        )
        comparison = compare(
            trace,
            settings,
            # The robust suite runs ours with the other of 0 and 1 spares beside it.
            Options(
                warm_spares,
                min_replicas,
                max_replicas,
                beside_spares=(1 if warm_spares == 0 else 0) if suite else None,
            ),
            names,
            progress=progress,
        )
        comparisons.append(comparison)
        if plots is not None:
            for written in report.plot(comparison, plots):
                progress(f"wrote {written}")
        if json_out:
            results.append(report.as_json(comparison))
        else:
            out.print(report.table(comparison))
            out.print(report.verdict(comparison), highlight=False)
    if json_out:
        document: dict[str, object] = {"traces": results}
        if suite is not None:
            document["summary"] = report.summary_json(comparisons)
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
    elif suite is not None:
        out.print(report.summary(comparisons))


def _check(suite: str | None, routing: str, profiles: Mapping[str, object]) -> None:
    if suite not in (None, "robust"):
        raise UserError(f"unknown suite {suite!r} (known: robust)")
    if routing not in profiles:
        raise UserError(f"unknown routing profile {routing!r} (known: {', '.join(profiles)})")


def _looser(a: str, b: str) -> str:
    """The trace kind whose default SLO is the looser (the larger TTFT target)."""
    return max((a, b), key=lambda kind: SLO_DEFAULTS[kind])
