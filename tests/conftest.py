"""Shared test configuration: cluster-marked tests run last, after the fast unit tests; the real
binaries tests run against (the engine simulator, Prometheus) as session fixtures, and a running
Prometheus per test.

`make test` builds every binary first, outside, then runs pytest in a loopback-only network
namespace (`llmfleet isolated`), where nothing can be downloaded: a binary missing there is an
error that says to run `llmfleet cluster build`, waiting first on a build already running.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from llmfleet.core.cluster import build
from tests.autoscaler.prom import Prometheus
from tests.interrupt import stop_on_sigterm
from tests.net import require_isolation
from tests.session_exit import SessionExit


def pytest_configure(config: pytest.Config) -> None:
    stop_on_sigterm()  # a killed run still stops the clusters and servers it started
    config.pluginmanager.register(SessionExit(), "llmfleet-session-exit")  # no abort at exit


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.get_closest_marker("cluster") is not None)


@pytest.fixture(scope="session")
def sim_binary() -> Path:
    """llm-d-inference-sim from the cache (waits on a running build)."""
    require_isolation()
    return build.ensure_binary("llm-d-inference-sim")


@pytest.fixture(scope="session")
def prometheus_binary() -> Path:
    """Prometheus from Debian's package, from the cache (waits on a running fetch)."""
    require_isolation()
    return build.ensure_binary("prometheus")


@pytest.fixture
def prometheus(prometheus_binary: Path, tmp_path: Path) -> Iterator[Prometheus]:
    """A running Prometheus (1 s scrapes, no targets yet), stopped after the test."""
    with Prometheus(prometheus_binary, tmp_path / "prometheus") as prom:
        yield prom
