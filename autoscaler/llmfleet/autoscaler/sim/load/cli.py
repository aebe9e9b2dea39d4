"""`llmfleet load --trace FILE`: replay a trace against the gateway, print latency and errors."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from llmfleet.autoscaler.sim.load import DEFAULT_GATEWAY_URL, GATEWAY_URL_ENV

PROGRESS_EVERY_S = 10.0
"""Seconds between progress lines when stderr is not a terminal."""

app = typer.Typer(add_completion=False)


@app.command(
    help="Replay a request trace against the gateway in open loop; report TTFT, ITL, errors."
)
def load(
    trace: Annotated[
        Path,
        typer.Option(help="Azure .csv or Mooncake .jsonl trace (`llmfleet sim` reads the same)."),
    ],
    *,
    speed: Annotated[
        float, typer.Option(help="Send at SPEED times the trace's pace (2: twice as fast).")
    ] = 1.0,
    duration: Annotated[
        float | None,
        typer.Option(help="Send only during the first SECONDS of the replay (default: all)."),
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="Model to ask for (default: the gateway's first).")
    ] = None,
    concurrency: Annotated[
        int,
        typer.Option(
            help="Most requests in flight; a request due beyond it is dropped, not delayed.",
            min=1,
        ),
    ] = 512,
    gateway: Annotated[
        str, typer.Option(envvar=GATEWAY_URL_ENV, help="The gateway's base URL.")
    ] = DEFAULT_GATEWAY_URL,
    api_key: Annotated[
        str | None,
        typer.Option(envvar="LLMFLEET_API_KEY", help="Sent as `Authorization: Bearer KEY`."),
    ] = None,
    ttft_slo_ms: Annotated[
        float | None, typer.Option(help="TTFT target (ms) for the attainment column.", min=0)
    ] = None,
    itl_slo_ms: Annotated[
        float | None, typer.Option(help="ITL target (ms) for the attainment column.", min=0)
    ] = None,
    kubeconfig: Annotated[
        Path | None,
        typer.Option(help="Read unset targets from the InferenceService serving the model."),
    ] = None,
    timeout: Annotated[
        float, typer.Option(help="Seconds without a byte after which a request fails.", min=1)
    ] = 600.0,
    seed: Annotated[
        int | None,
        typer.Option(help="Prompt text seed (default: a new one per run, so caches start cold)."),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    quiet: Annotated[bool, typer.Option(help="No progress on stderr.")] = False,
) -> None:
    """Send the trace's requests at their times (divided by --speed) as streamed completions
    of the trace's prompt and output lengths; print requests sent/ok/failed, TTFT and ITL
    percentiles, SLO attainment and errors by kind. Exits 1 when no request was answered."""
    # Imported here: `llmfleet --help` imports every command's module, and this one costs 0.3 s.
    from llmfleet.autoscaler.sim.load import run

    run.main(
        run.Options(
            trace=trace,
            speed=speed,
            duration_s=duration,
            model=model,
            concurrency=concurrency,
            gateway=gateway,
            api_key=api_key,
            ttft_slo_ms=ttft_slo_ms,
            itl_slo_ms=itl_slo_ms,
            kubeconfig=kubeconfig,
            timeout_s=timeout,
            seed=seed,
            json_out=json_out,
            quiet=quiet,
            progress_every_s=PROGRESS_EVERY_S,
        )
    )
