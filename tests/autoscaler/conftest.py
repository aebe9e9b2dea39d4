"""Real binaries for the signals tests: Prometheus (Debian's package) and the engine simulator,
fetched or built into the cache on first use (waiting on a build already running)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from llmfleet.core.cluster import build
from tests.autoscaler.prom import Prometheus


@pytest.fixture(scope="session")
def prometheus_binary() -> Path:
    return build.ensure_binary("prometheus")


@pytest.fixture(scope="session")
def sim_binary() -> Path:
    return build.ensure_binary("llm-d-inference-sim")


@pytest.fixture
def prometheus(prometheus_binary: Path, tmp_path: Path) -> Iterator[Prometheus]:
    """A running Prometheus (1 s scrapes, no targets yet), stopped after the test."""
    with Prometheus(prometheus_binary, tmp_path / "prometheus") as prom:
        yield prom
