"""Shared test configuration: cluster-marked tests run last, after the fast unit tests.

CI starts the cold Go build in the background before pytest; running the cluster tests last
gives that build the whole unit-test run to make progress before the cluster fixture waits on it.
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.get_closest_marker("cluster") is not None)
