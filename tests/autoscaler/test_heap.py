"""The autoscaler's heap frozen after its first pass (`cli.freeze_heap`, issue 28): what is
alive then is out of the collector's walks, and what dies later is still freed."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from llmfleet.autoscaler.cli import freeze_heap


class _Kept:
    pass


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


@pytest.mark.usefixtures("unfrozen")
def test_what_is_alive_is_frozen_and_what_dies_later_is_freed() -> None:
    kept = _Kept()
    alive = weakref.ref(kept)
    frozen = freeze_heap()
    assert frozen == gc.get_freeze_count() > 0
    assert not any(obj is kept for obj in gc.get_objects())  # frozen: not walked
    del kept
    assert alive() is None  # reference counting frees it all the same
