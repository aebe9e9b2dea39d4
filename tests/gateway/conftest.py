"""The engine simulator the gateway tests run against (built from Go on first use)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmfleet.core.cluster import build
from llmfleet.core.cluster.toolchain import TOOLS_BY_NAME


@pytest.fixture(scope="session")
def sim_binary() -> Path:
    """llm-d-inference-sim, built into the cache if missing (waits on a running build)."""
    tool = TOOLS_BY_NAME["llm-d-inference-sim"]
    build.ensure_tools([tool])
    return build.binary(tool, "llm-d-inference-sim")
