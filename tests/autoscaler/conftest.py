"""A real Prometheus for the signals tests (its binary and the simulator's: tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.autoscaler.prom import Prometheus


@pytest.fixture
def prometheus(prometheus_binary: Path, tmp_path: Path) -> Iterator[Prometheus]:
    """A running Prometheus (1 s scrapes, no targets yet), stopped after the test."""
    with Prometheus(prometheus_binary, tmp_path / "prometheus") as prom:
        yield prom
