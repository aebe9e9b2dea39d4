"""The `llmfleet` command group and how it runs, shared by the full command line (cli.py) and
the images' (entry.py): core's own commands, then each component's from its entry point
(`COMMANDS_GROUP`), imported only when that command runs or a help page lists it."""

from __future__ import annotations

import sys
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from llmfleet.core.errors import UserError

if TYPE_CHECKING:
    from typer._click import Command, Context  # typer's own copy of click

COMMANDS_GROUP = "llmfleet.commands"
"""Entry-point group through which components add sub-commands (`llmfleet operator`, …) without
core importing them: each entry point names a typer app, run as `llmfleet <entry name>`. An app
with one command (and no callback) is that command itself: `llmfleet gateway [OPTIONS]`."""


class ComponentGroup(TyperGroup):
    """The `llmfleet` group: core's own commands, then each component's from its entry point."""

    def list_commands(self, ctx: Context) -> list[str]:
        own = super().list_commands(ctx)
        return [*own, *(name for name in _entries() if name not in own)]

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        own = super().get_command(ctx, cmd_name)
        if own is not None or cmd_name not in _entries():
            return own
        return _component(cmd_name)


@cache
def _entries() -> dict[str, EntryPoint]:
    return {entry.name: entry for entry in entry_points(group=COMMANDS_GROUP)}


@cache
def _component(name: str) -> Command:
    """The component's command; one that cannot load breaks only itself."""
    try:
        command = _entries()[name].load()
    except Exception as error:  # a broken component must not take the others down
        command = unavailable(name, f"{type(error).__name__}: {error}")
    click_command = typer.main.get_command(command)
    click_command.name = name  # a one-command app's command is named after its function
    return click_command


def unavailable(name: str, why: str) -> typer.Typer:
    """A command that only says `llmfleet <name>` cannot run, and why (exit 1)."""
    broken = typer.Typer(help=f"(unavailable: {why})", invoke_without_command=True)

    @broken.callback(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    def fail() -> None:
        raise UserError(f"`llmfleet {name}` cannot load: {why}")

    return broken


def run(app: typer.Typer) -> None:
    """Run the app, turning UserError into one line on stderr (per problem) and exit 1."""
    try:
        app(standalone_mode=True)
    except UserError as error:
        err = Console(stderr=True)
        for line in str(error).splitlines() or [""]:  # one problem a line, each marked
            err.print(f"[bold red]error:[/] {escape(line)}", highlight=False, soft_wrap=True)
        sys.exit(1)
