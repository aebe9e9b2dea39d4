"""Command-line options over environment settings: what every `llmfleet` command does alike."""

from __future__ import annotations

from typing import Any


def given(**options: Any) -> dict[str, Any]:
    """The options the user gave on the command line (typer leaves the others None), as keyword
    arguments for a settings class: they override its environment variables and defaults."""
    return {name: value for name, value in options.items() if value is not None}
