"""End to end: the load an engine reports on /metrics steers the gateway's routing.

Two simulators, one reporting itself busy through `--fake-metrics` (50 waiting, 5 running, KV
90 % full). Every load-aware profile must keep traffic off it once the scraper has read it;
round-robin, the blind baseline, must not (so the test can tell the difference).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llmfleet.gateway.discovery import Pool, Service, StaticDiscovery
from tests.gateway.servers import Sim, gateway, wait_for

MODEL = "m"
BUSY = '{"waiting-requests":50,"running-requests":5,"kv-cache-usage":0.9}'


@pytest.fixture(scope="module")
def engines(sim_binary: Path) -> Iterator[tuple[Sim, Sim]]:
    idle = Sim(sim_binary, MODEL)
    busy = Sim(sim_binary, MODEL, "--fake-metrics", BUSY)
    try:
        yield idle, busy
    finally:
        idle.kill()
        busy.kill()


@pytest.mark.parametrize(
    ("profile", "busy_share"),
    [
        pytest.param("prefix-load", 0, id="prefix-load"),
        pytest.param("least-loaded", 0, id="least-loaded"),
        pytest.param("round-robin", 10, id="round-robin-is-blind"),
    ],
)
def test_busy_engine_gets_no_traffic(
    engines: tuple[Sim, Sim], profile: str, busy_share: int
) -> None:
    idle, busy = engines
    pool = Pool("unified", (idle.url, busy.url))
    discovery = StaticDiscovery({MODEL: Service(MODEL, "ns", "svc", {"unified": pool})})
    with gateway(discovery, profile=profile) as server:
        table = server.server.config.app.state.table  # type: ignore[attr-defined]

        def ask(content: str) -> str:
            body = {"model": MODEL, "messages": [{"role": "user", "content": content}]}
            response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=10)
            endpoint: str = response.headers["x-llmfleet-endpoint"]
            return endpoint

        # Only pools with traffic are scraped: the first request makes this one active (and
        # is routed on in-flight counts alone, so it is not counted).
        ask("warm-up")
        wait_for(
            lambda: table.get(busy.url).load or None, 30, "the first scrape of the busy engine"
        )
        served = Counter(ask(f"question {i}") for i in range(20))
    assert served[busy.url] == busy_share
