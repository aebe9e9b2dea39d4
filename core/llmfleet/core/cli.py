"""The `llmfleet` command line (typer + rich).

Errors a person can act on (`UserError`) print one red line per problem and exit 1, never a
traceback.
"""

from __future__ import annotations

import os
import shlex
import sysconfig
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from llmfleet.core import loopback, netns
from llmfleet.core.cluster import ClusterError, LocalCluster, build
from llmfleet.core.cluster.local import DEFAULT_NAME
from llmfleet.core.cluster.nodes import DEFAULT_POOLS, GPU_TYPES, format_pools, parse_pools
from llmfleet.core.cluster.toolchain import TOOLS, TOOLS_BY_NAME, Tool
from llmfleet.core.components import ComponentGroup, run
from llmfleet.core.errors import UserError
from llmfleet.core.images.cli import app as images_app

# Imports here are what `llmfleet --help` and `llmfleet cluster …` pay for on every run; heavier
# modules (the CRD models, the components) are imported inside the commands that use them.


app = typer.Typer(
    cls=ComponentGroup,
    name="llmfleet",
    help="Kubernetes operator and control plane for LLM serving fleets.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
cluster_app = typer.Typer(
    help="The local Kubernetes cluster (real control plane, fake GPU nodes).",
    no_args_is_help=True,
)
app.add_typer(cluster_app, name="cluster")
crds_app = typer.Typer(help="The InferenceService CRD rendered from the API models.")
app.add_typer(crds_app, name="crds")
app.add_typer(images_app, name="images")

out = Console()
err = Console(stderr=True)

NameOption = Annotated[str, typer.Option("--name", help="Cluster name.")]


class _BuildReporter:
    """Shows Go builds: a live spinner with the latest output on a terminal; otherwise (CI logs)
    each step plus a heartbeat line every 30 s, so a long silent compile visibly makes progress."""

    HEARTBEAT_SECONDS = 30.0

    def __init__(self, progress: Progress | None) -> None:
        self._progress = progress
        self._tasks: dict[str, TaskID] = {}
        self._current: tuple[str, float] | None = None
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        if progress is None:
            self._heartbeat = threading.Thread(target=self._beat, daemon=True)
            self._heartbeat.start()

    def __call__(self, tool: Tool, line: str) -> None:
        if self._current is None or self._current[0] != tool.key:
            self._current = (tool.key, time.monotonic())
        if self._progress is not None:
            if tool.key not in self._tasks:
                self._tasks[tool.key] = self._progress.add_task(tool.key, total=None)
            self._progress.update(self._tasks[tool.key], description=f"{tool.key}: {line[-80:]}")
        elif line.startswith("building"):
            err.print(f"{tool.key}: {line}", highlight=False)

    def _beat(self) -> None:
        while not self._stop.wait(self.HEARTBEAT_SECONDS):
            if self._current is not None:
                key, since = self._current
                err.print(f"{key}: still building ({time.monotonic() - since:.0f}s)")

    def close(self) -> None:
        self._stop.set()


@contextmanager
def _build_reporter() -> Iterator[_BuildReporter]:
    if not err.is_terminal:
        reporter = _BuildReporter(None)
        try:
            yield reporter
        finally:
            reporter.close()
        return
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True) as progress:
        yield _BuildReporter(progress)


def _step(message: str) -> None:
    err.print(f"[bold cyan]>[/] {message}")


@cluster_app.command("build")
def cluster_build(
    tools: Annotated[
        list[str] | None,
        typer.Argument(help=f"Tools to build (default: all): {', '.join(TOOLS_BY_NAME)}."),
    ] = None,
) -> None:
    """Build the pinned binaries into ~/.cache/llmfleet, only what is missing.

    Go modules for Kubernetes, etcd, kwok, helm and the engine simulator; Prometheus from
    Debian's package."""
    unknown = sorted(set(tools or ()) - set(TOOLS_BY_NAME))
    if unknown:
        choices = ", ".join(TOOLS_BY_NAME)
        raise ClusterError(f"unknown tool(s) {', '.join(unknown)}: choose from {choices}")
    selected = [TOOLS_BY_NAME[name] for name in tools] if tools else list(TOOLS)
    started = time.monotonic()
    with _build_reporter() as reporter:
        spent = build.ensure_tools(selected, progress=reporter)
    for key, seconds in spent.items():
        _step(f"built {key} in {seconds:.0f}s")
    elapsed = time.monotonic() - started
    _step(f"all {len(selected)} tool(s) ready in {build.cache_root()} ({elapsed:.0f}s)")


@cluster_app.command("up")
def cluster_up(
    *,
    name: NameOption = DEFAULT_NAME,
    pools: Annotated[
        str | None,
        typer.Option(
            help=f"GPU node pools as TYPE=NODES,... (default: {format_pools(DEFAULT_POOLS)})."
        ),
    ] = None,
    nodes: Annotated[
        int | None,
        typer.Option(help="Instead of the pools: this many nodes of --gpu-type (else H100)."),
    ] = None,
    gpus_per_node: Annotated[int, typer.Option(help="nvidia.com/gpu per node.")] = 8,
    gpu_type: Annotated[
        str | None,
        typer.Option(
            help=f"Instead of the pools: one GPU type, {', '.join(GPU_TYPES)} (2 nodes "
            "unless --nodes)."
        ),
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="kube-apiserver port on 127.0.0.1 (default: a free one).")
    ] = None,
    real_node: Annotated[
        bool,
        typer.Option(
            help="Also a real node (kubelet, containerd, runc) running real containers; only "
            "inside a network namespace of the run's own (`llmfleet isolated -- llmfleet "
            "cluster up --real-node`), else it says why and goes on without."
        ),
    ] = False,
) -> None:
    """Start the local cluster: build missing binaries, start the control plane, add GPU nodes."""
    cluster = LocalCluster(name)
    started = time.monotonic()
    with _build_reporter() as reporter:
        cluster.up(
            nodes,
            gpus_per_node=gpus_per_node,
            gpu_type=gpu_type,
            pools=parse_pools(pools, gpus_per_node) if pools is not None else None,
            port=port,
            real_node=real_node,
            step=_step,
            build_progress=reporter,
        )
    _step(f"cluster {name!r} ready in {time.monotonic() - started:.1f}s")
    _print_nodes(cluster)
    out.print(f"\nexport KUBECONFIG={cluster.kubeconfig}", highlight=False)


@cluster_app.command("down")
def cluster_down(name: NameOption = DEFAULT_NAME) -> None:
    """Stop the local cluster and remove its state; no process or port is left behind."""
    cluster = LocalCluster(name)
    if not cluster.dir.exists():
        _step(f"cluster {name!r} is not running; nothing to do")
        return
    killed = cluster.down()
    if killed:
        _step(f"stopped leftover components: {', '.join(killed)}")
    _step(f"cluster {name!r} is down")


@cluster_app.command("status")
def cluster_status(name: NameOption = DEFAULT_NAME) -> None:
    """Show whether the cluster runs, its components, and its GPU nodes (exit 1 when down)."""
    cluster = LocalCluster(name)
    status = cluster.status()
    if not status.running_components:
        err.print(f"cluster {name!r} is not running (`llmfleet cluster up` starts it)")
        raise typer.Exit(1)
    spec = status.spec
    where = f" on 127.0.0.1:{spec.port}" if spec else ""
    health = "[green]API ready[/]" if status.api_ready else "[red]API not ready[/]"
    out.print(f"cluster {name!r}{where}: {health}")
    out.print(f"components: {', '.join(status.running_components)}", highlight=False)
    out.print(f"kubeconfig: {status.kubeconfig}", highlight=False)
    if spec:
        out.print(f"pools: {', '.join(pool.describe() for pool in spec.pools)}", highlight=False)
    _print_nodes(cluster)
    if not status.api_ready:
        raise typer.Exit(1)


@cluster_app.command("env")
def cluster_env(name: NameOption = DEFAULT_NAME) -> None:
    """Print the shell environment for the cluster: eval "$(llmfleet cluster env)".

    Its KUBECONFIG; LLMFLEET_LOOPBACK_ONLY, so llmfleet's components started from this shell
    never connect to the cluster's fake pod IPs; and PATH with the kubectl built for this
    cluster's version and this llmfleet first, so neither another kubectl nor an inactive
    virtualenv gets in the way."""
    cluster = LocalCluster(name)
    if not cluster.kubeconfig.is_file():
        raise ClusterError(f"cluster {name!r} is not running (`llmfleet cluster up` starts it)")
    # The scripts directory of the environment running this llmfleet (.venv/bin), where pip put
    # the `llmfleet` command.
    first = dict.fromkeys(
        [build.bin_dir(TOOLS_BY_NAME["kubernetes"]), Path(sysconfig.get_path("scripts"))]
    )
    path = os.pathsep.join(shlex.quote(str(directory)) for directory in first)
    for line in (
        f"export KUBECONFIG={shlex.quote(str(cluster.kubeconfig))}",
        f"export {loopback.ENV}=true",
        f'export PATH={path}{os.pathsep}"$PATH"',
    ):
        out.print(line, markup=False, highlight=False, soft_wrap=True)


@app.command(
    "isolated",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def isolated(ctx: typer.Context) -> None:
    """Run a command in a new network namespace with only loopback.

    `llmfleet isolated -- python -m pytest`, as make test does, with LLMFLEET_LOOPBACK_ONLY on.
    Needs root and `unshare`."""
    if not ctx.args:
        raise UserError("usage: llmfleet isolated -- CMD [ARG...]")
    netns.exec_isolated(list(ctx.args))


@crds_app.command("render")
def crds_render() -> None:
    """Write the CRD rendered from the models to crds/manifests/."""
    from llmfleet.crds import render

    for path in render.write():
        _step(f"wrote {path}")


@crds_app.command("check")
def crds_check() -> None:
    """Exit 1 when the committed CRD differs from what the models render."""
    from llmfleet.crds import render

    stale = render.stale_files()
    if stale:
        names = ", ".join(str(path) for path in stale)
        raise UserError(f"{names} is stale: run `llmfleet crds render` and commit the result")
    _step(f"{render.CRD_FILE} is up to date")


def _print_nodes(cluster: LocalCluster) -> None:
    table = Table("NODE", "READY", "GPU", "GPUS", title="GPU nodes", title_justify="left")
    for node in cluster.status().nodes:
        table.add_row(node.name, node.ready, node.gpu_type, node.gpus)
    out.print(table)


def main() -> None:
    """Entry point (through entry.py): run the app, turning UserError into one line on stderr
    and exit 1."""
    from llmfleet.core.local import commands as local_commands  # up, status, down

    local_commands.register(app, _build_reporter)
    run(app)


if __name__ == "__main__":
    main()
