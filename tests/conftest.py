"""Shared test configuration: cluster-marked tests run last, after the fast unit tests; the real
binaries tests run against (the engine simulator, Prometheus) as session fixtures.

CI starts the cold Go build in the background before pytest; running the cluster tests last
gives that build the whole unit-test run to make progress before the cluster fixture waits on it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llmfleet.core.cluster import build


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.get_closest_marker("cluster") is not None)


@pytest.fixture(scope="session")
def sim_binary() -> Path:
    """llm-d-inference-sim, built from Go into the cache if missing (waits on a running build)."""
    return build.ensure_binary("llm-d-inference-sim")


@pytest.fixture(scope="session")
def prometheus_binary() -> Path:
    """Prometheus from Debian's package, fetched into the cache if missing."""
    return build.ensure_binary("prometheus")
