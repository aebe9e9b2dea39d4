"""`llmfleet --help` lists every command without importing the components' heavy dependencies,
and each component's command is a leaf: `llmfleet gateway [OPTIONS]`, its defaults shown."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from llmfleet.core.components import COMMANDS_GROUP

COMPONENTS = sorted(entry.name for entry in entry_points(group=COMMANDS_GROUP))
HEAVY = ("kopf", "fastapi", "uvicorn", "aiohttp", "matplotlib", "numpy", "prometheus_client")
"""What the components run on; a help page needs none of it."""


LLMFLEET = Path(sys.executable).parent / "llmfleet"


def llmfleet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LLMFLEET), *args],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip


def test_entry_points_name_the_components() -> None:
    assert {"operator", "gateway", "autoscaler", "sim"} <= set(COMPONENTS)


def test_help_lists_every_command() -> None:
    result = llmfleet("--help")
    assert result.returncode == 0, result.stderr
    listed = {
        line.split()[1]
        for line in result.stdout.splitlines()
        if line.startswith("│ ") and len(line.split()) > 2 and line.split()[1][0].isalpha()
    }
    assert {"cluster", "crds", "isolated", *COMPONENTS} <= listed, result.stdout


@pytest.mark.parametrize("args", [["--help"], ["cluster", "--help"]], ids=" ".join)
def test_help_imports_no_component_dependency(args: list[str]) -> None:
    code = (
        "import sys; from llmfleet.core.cli import main; sys.argv = ['llmfleet', *sys.argv[1:]]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        f"print('IMPORTED', *sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.splitlines()[-1] == "IMPORTED"


@pytest.mark.parametrize("component", ["operator", "gateway", "autoscaler", "sim", "load"])
def test_a_component_command_is_a_leaf(component: str) -> None:
    result = llmfleet(component, "--help")
    assert result.returncode == 0, result.stderr
    usage = next(line for line in result.stdout.splitlines() if "Usage:" in line)
    assert f"llmfleet {component} [OPTIONS]" in usage
    assert "COMMAND" not in usage


@pytest.mark.parametrize(
    ("component", "shown"),
    [
        pytest.param("gateway", ["[default: (127.0.0.1)]", "[default: (8080)]"], id="gateway"),
        pytest.param("operator", ["[default: (llmfleet)]"], id="operator"),
        pytest.param(
            "autoscaler", ["[default: (15)]", "[default: (all namespaces)]"], id="autoscaler"
        ),
        pytest.param("sim", ["[default: 64]", "[default: 90.0]"], id="sim"),
    ],
)
def test_options_show_their_defaults(component: str, shown: list[str]) -> None:
    page = llmfleet(component, "--help").stdout
    for text in shown:
        assert text in page
