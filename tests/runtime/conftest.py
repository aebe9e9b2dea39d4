"""Fixtures of the runtime tests that start launchers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.runtime.processes import Launchers


@pytest.fixture
def launchers(tmp_path: Path) -> Iterator[Launchers]:
    started = Launchers(tmp_path)
    yield started
    started.close()
