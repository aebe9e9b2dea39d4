"""The `llmfleet` console script: the whole command line where llmfleet is installed with its
local tooling (a workstation, CI), and the components' commands alone in an image.

The images leave out core's local tooling (`LOCAL_TOOLING`: the local cluster's Go builds and
kwok, the pod runner, the image builder) and the simulator; there the commands that need them
say so in one line (`not in this image`) instead of a traceback.
"""

from __future__ import annotations

import typer

from llmfleet.core.components import ComponentGroup, run
from llmfleet.core.errors import UserError

LOCAL_TOOLING = ("llmfleet.core.cluster", "llmfleet.core.local", "llmfleet.core.images")
LOCAL_COMMANDS = ("cluster", "up", "status", "down", "images", "isolated", "crds", "sim", "load")
"""Commands of a workstation: the local system, the image builder, the CRD renderer and the
simulator and load generator."""


def _is_local_tooling(module: str | None) -> bool:
    return module is not None and any(
        module == name or module.startswith(f"{name}.") for name in LOCAL_TOOLING
    )


def image_app() -> typer.Typer:
    """The command line of an image: the components, and a stub for each local command."""
    app = typer.Typer(
        cls=ComponentGroup,
        name="llmfleet",
        help="Kubernetes operator and control plane for LLM serving fleets (this image runs "
        "`llmfleet operator|gateway|autoscaler`).",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
    )
    for name in LOCAL_COMMANDS:
        _stub(app, name)
    return app


def _stub(app: typer.Typer, name: str) -> None:
    @app.command(
        name,
        help="(not in this image: a workstation command)",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        add_help_option=False,
    )
    def not_here() -> None:
        raise UserError(
            f"`llmfleet {name}` is not in this image: it is workstation tooling, installed "
            "with llmfleet's `local` and `sim` extras (pip install 'llmfleet[local,sim]')"
        )


def main() -> None:
    try:
        from llmfleet.core import cli  # noqa: PLC0415  (imports the local tooling)
    except ModuleNotFoundError as error:
        if not _is_local_tooling(error.name):
            raise
        run(image_app())
        return
    cli.main()
