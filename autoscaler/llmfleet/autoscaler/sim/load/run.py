"""One `llmfleet load` run: trace → plan → replay with progress → summary on stdout."""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from llmfleet.autoscaler.sim import traces
from llmfleet.autoscaler.sim.load import GATEWAY_URL_ENV, report
from llmfleet.autoscaler.sim.load.plan import PlannedRequest, PromptBuilder, plan
from llmfleet.autoscaler.sim.load.replay import OpenAISender, Tally, replay, served_models
from llmfleet.autoscaler.sim.load.slo import read_slo
from llmfleet.autoscaler.sim.load.stats import Outcome, Slo, Summary, summarize
from llmfleet.core import loopback
from llmfleet.core.errors import UserError


@dataclass(frozen=True)
class Options:
    trace: Path
    speed: float
    duration_s: float | None
    model: str | None
    concurrency: int
    gateway: str
    api_key: str | None
    ttft_slo_ms: float | None
    itl_slo_ms: float | None
    kubeconfig: Path | None
    timeout_s: float
    seed: int | None
    json_out: bool
    quiet: bool
    progress_every_s: float


@dataclass(frozen=True)
class Result:
    summary: Summary
    model: str
    slo_source: str | None
    """Where the SLO targets came from (`options`, `InferenceService NS/NAME`), None: none."""


def main(options: Options) -> None:
    err = Console(stderr=True)
    gateway = options.gateway.rstrip("/")
    try:
        loopback.LoopbackGuard(loopback.enabled()).check_url(gateway, "load")
    except loopback.NonLocalRefused as refused:
        raise UserError(f"{refused}: {loopback.ENV} allows only loopback gateways") from None
    limit = options.duration_s * options.speed if options.duration_s is not None else None
    trace = traces.load(options.trace, limit_s=limit)
    planned = plan(trace, speed=options.speed, duration_s=options.duration_s)
    seed = options.seed if options.seed is not None else random.randrange(2**31)
    result = asyncio.run(
        _run(options, gateway=gateway, trace=trace, planned=planned, seed=seed, err=err)
    )
    summary = result.summary
    context = {
        "trace": trace.name,
        "gateway": gateway,
        "model": result.model,
        "speed": options.speed,
        "seed": seed,
        "sloSource": result.slo_source,
    }
    if options.json_out:
        sys.stdout.write(json.dumps(report.as_json(summary, **context), indent=2) + "\n")
    else:
        out = Console()
        if not out.is_terminal:
            out = Console(width=120)
        title = (
            f"{trace.name} x{options.speed:g} -> {gateway}, model {result.model}: "
            f"{summary.planned} requests in {summary.wall_s:.1f} s"
        )
        out.print(report.tables(summary, title))
    if summary.ok == 0:
        raise typer.Exit(1)


async def _run(
    options: Options,
    *,
    gateway: str,
    trace: traces.Trace,
    planned: list[PlannedRequest],
    seed: int,
    err: Console,
) -> Result:
    headers = {"Authorization": f"Bearer {options.api_key}"} if options.api_key else {}
    async with httpx.AsyncClient(
        base_url=gateway,
        headers=headers,
        timeout=httpx.Timeout(options.timeout_s, connect=10.0),
        # One connection per request in flight: the cap keeps the pool from ever queueing.
        limits=httpx.Limits(
            max_connections=options.concurrency, max_keepalive_connections=options.concurrency
        ),
    ) as client:
        model = options.model or await _first_model(client, gateway)
        slo, source = _slo(options, model, err)
        if not options.quiet:
            span = planned[-1].send_at if planned else 0.0
            err.print(
                f"load: {len(planned)} requests from {trace.name} over {span:.0f} s "
                f"(speed {options.speed:g}) to {gateway}, model {model}",
                highlight=False,
                soft_wrap=True,
            )
        tally = Tally(len(planned))
        sender = OpenAISender(client, model, PromptBuilder(seed, block_tokens=trace.block_tokens))
        replaying = replay(planned, sender, concurrency=options.concurrency, tally=tally)
        if options.quiet:
            outcomes, wall_s = await replaying
        else:
            outcomes, wall_s = await _with_progress(replaying, tally, err, options)
    return Result(summarize(outcomes, slo, wall_s), model, source)


async def _first_model(client: httpx.AsyncClient, gateway: str) -> str:
    try:
        models = await served_models(client)
    except httpx.HTTPStatusError as error:
        status = error.response.status_code
        raise UserError(f"{gateway}/v1/models answered {status}: pass --model") from None
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as error:
        raise UserError(
            f"cannot list models at {gateway}/v1/models ({type(error).__name__}: {error}); "
            f"is the gateway there? (--gateway or {GATEWAY_URL_ENV})"
        ) from None
    if not models:
        raise UserError(f"the gateway at {gateway} serves no model yet")
    return models[0]


def _slo(options: Options, model: str, err: Console) -> tuple[Slo, str | None]:
    """Targets from the options; those unset from the model's InferenceService (--kubeconfig)."""
    slo = Slo(options.ttft_slo_ms, options.itl_slo_ms)
    source = "options" if slo.ttft_ms is not None or slo.itl_ms is not None else None
    if options.kubeconfig is None or (slo.ttft_ms is not None and slo.itl_ms is not None):
        return slo, source
    found = read_slo(options.kubeconfig, model)
    if found is None:
        if not options.quiet:
            err.print(
                f"load: no InferenceService serves {model!r}; no SLO from the cluster",
                highlight=False,
                soft_wrap=True,
            )
        return slo, source
    name, service = found
    merged = Slo(
        slo.ttft_ms if slo.ttft_ms is not None else service.ttft_ms,
        slo.itl_ms if slo.itl_ms is not None else service.itl_ms,
    )
    return merged, f"InferenceService {name}" if source is None else f"options, {name}"


def progress_line(tally: Tally, elapsed_s: float) -> str:
    return (
        f"load: {tally.done}/{tally.planned} done in {elapsed_s:.0f}s: {tally.ok} ok, "
        f"{tally.failed} failed, {tally.dropped} dropped, {tally.in_flight} in flight"
    )


async def _with_progress(
    replaying: Coroutine[Any, Any, tuple[list[Outcome], float]],
    tally: Tally,
    err: Console,
    options: Options,
) -> tuple[list[Outcome], float]:
    """A rich progress bar on a terminal; otherwise a progress line every few seconds."""
    task = asyncio.create_task(replaying)
    started = time.monotonic()
    if not err.is_terminal:
        while not task.done():
            await asyncio.wait({task}, timeout=options.progress_every_s)
            if not task.done():
                line = progress_line(tally, time.monotonic() - started)
                err.print(line, highlight=False, soft_wrap=True)
        return task.result()
    columns = (
        TextColumn("load"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[counts]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=err) as progress:
        bar = progress.add_task("load", total=tally.planned, counts="")
        while not task.done():
            await asyncio.wait({task}, timeout=0.25)
            counts = (
                f"{tally.ok} ok, {tally.failed} failed, {tally.dropped} dropped, "
                f"{tally.in_flight} in flight"
            )
            progress.update(bar, completed=tally.done, counts=counts)
    return task.result()
