"""The gateway under LLMFLEET_LOOPBACK_ONLY: endpoints outside loopback are refused before any
connection, by the upstream client and the scraper alike; the request goes to a loopback
endpoint when the pool has one, else gets a 502 that says why (issue 11)."""

from __future__ import annotations

import logging
import re

import httpx
import pytest

from llmfleet.gateway.discovery import Pool, Service, StaticDiscovery
from tests.gateway.servers import ThreadServer, gateway, wait_for
from tests.gateway.standin import StandIn
from tests.net import require_isolation

MODEL = "m"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
POD_IP = "http://10.0.0.5:8000"


def _one_pool(*urls: str) -> StaticDiscovery:
    return StaticDiscovery({MODEL: Service(MODEL, "ns", "svc", {"unified": Pool("unified", urls)})})


def _refused(server: ThreadServer) -> dict[str, float]:
    text = httpx.get(f"{server.url}/metrics").text
    found = re.findall(
        r'^llmfleet_gateway_nonlocal_refused_total\{client="(\w+)"\} (\S+)$', text, re.MULTILINE
    )
    return {client: float(value) for client, value in found}


@pytest.fixture(autouse=True)
def _isolated() -> None:
    require_isolation()  # were the guard broken, these tests would contact 10.0.0.5


@pytest.mark.parametrize("upstream", ["wire", "aiohttp", "httpx"])
def test_a_pool_with_a_loopback_endpoint_serves_and_the_pod_ip_is_only_counted(
    upstream: str, caplog: pytest.LogCaptureFixture
) -> None:
    engine = StandIn("engine")
    with (
        caplog.at_level(logging.WARNING),
        ThreadServer(engine.app()) as backend,
        gateway(
            _one_pool(POD_IP, backend.url), loopback_only=True, upstream_client=upstream
        ) as server,
    ):
        answers = [
            httpx.post(f"{server.url}/v1/chat/completions", json=BODY, timeout=10) for _ in range(6)
        ]
        wait_for(lambda: _refused(server).get("scrape", 0) >= 2 or None, 30, "scrape refusals")
        refused = _refused(server)
    assert [a.status_code for a in answers] == [200] * 6
    assert len(engine.received) == 6
    assert refused.get("scrape", 0) >= 2
    warnings = [r.getMessage() for r in caplog.records if "refusing connections" in r.getMessage()]
    # One line per endpoint and client, however many attempts.
    assert len(warnings) == 1, warnings
    assert "10.0.0.5:8000" in warnings[0]


def test_a_pool_of_pod_ips_only_gets_a_502_that_says_why() -> None:
    with gateway(_one_pool(POD_IP, "http://10.0.0.6:8000"), loopback_only=True) as server:
        answer = httpx.post(f"{server.url}/v1/chat/completions", json=BODY, timeout=10)
        refused = _refused(server)
    assert answer.status_code == 502
    error = answer.json()["error"]
    assert error["code"] == "upstream_unavailable"
    assert "10.0.0.5:8000 is outside 127.0.0.0/8 and ::1" in error["message"]
    assert "LLMFLEET_LOOPBACK_ONLY is on" in error["message"]
    assert refused["upstream"] == 2  # both endpoints, each once: no retry of a refused one
