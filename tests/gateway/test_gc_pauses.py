"""The gateway's heap freezes (`gc_pauses`): the start-up heap, and again once discovery's first
snapshot is in, so full collections under load do not walk the fleet discovery keeps."""

from __future__ import annotations

import asyncio
import gc
import logging

import httpx
import pytest

from llmfleet.gateway.discovery import Pool, Service, StaticDiscovery
from llmfleet.gateway.gc_pauses import became_ready, freeze_startup_heap
from tests.gateway.servers import gateway
from tests.net import wait_for


@pytest.mark.parametrize(
    ("ready_after", "deadline", "became"),
    [
        pytest.param(0, 1.0, True, id="ready-at-once"),
        pytest.param(3, 1.0, True, id="ready-on-the-third-look"),
        pytest.param(None, 0.05, False, id="never-ready-gives-up-at-the-deadline"),
    ],
)
def test_became_ready(ready_after: int | None, deadline: float, became: bool) -> None:
    looks = 0

    def ready() -> bool:
        nonlocal looks
        looks += 1
        return ready_after is not None and looks > ready_after

    found = asyncio.run(became_ready(ready, every=0.01, deadline=deadline))
    assert found is became
    if ready_after is not None:
        assert looks == ready_after + 1


def test_a_freeze_takes_what_is_alive_out_of_the_collectors_walk() -> None:
    gc.unfreeze()
    try:
        kept = [{"endpoint": str(i)} for i in range(10_000)]
        frozen = freeze_startup_heap()
        assert frozen >= len(kept)
        assert gc.get_count()[0] < 1_000  # the young generation starts empty again
    finally:
        gc.unfreeze()


class _Later(StaticDiscovery):
    """A static discovery whose first snapshot comes only when the test says so."""

    def __init__(self) -> None:
        pool = Pool("unified", ("http://127.0.0.1:9",))
        super().__init__({"m": Service("m", "ns", "svc", {"unified": pool})})
        self.now_ready = False

    def ready(self) -> bool:
        return self.now_ready


def test_the_gateway_freezes_again_once_discovery_is_ready(
    caplog: pytest.LogCaptureFixture,
) -> None:
    discovery = _Later()

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if "discovered fleet" in r.getMessage()]

    try:
        with caplog.at_level(logging.INFO, "llmfleet.gateway"), gateway(discovery) as server:
            assert httpx.get(f"{server.url}/readyz", timeout=5).status_code == 503
            assert said() == []  # not before discovery is ready
            discovery.now_ready = True
            (line,) = wait_for(lambda: said() or None, 10, "the freeze with the fleet")
        assert "froze" in line
    finally:
        gc.unfreeze()
