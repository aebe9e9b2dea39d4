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
