"""API keys and per-tenant limits: token buckets (table, injected clock), the app's answers."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from llmfleet.gateway.app import create_app
from llmfleet.gateway.discovery import Pool, Service, StaticDiscovery
from llmfleet.gateway.settings import GatewaySettings
from llmfleet.gateway.tenants import Bucket, Tenants, TenantsError


@pytest.mark.parametrize(
    ("level", "elapsed", "amount", "wait"),
    [
        pytest.param(60, 0, 1, 0.0, id="full-bucket-admits"),
        pytest.param(0, 0, 1, 1.0, id="empty-waits-one-refill"),
        pytest.param(0, 0.5, 1, 0.5, id="half-refilled"),
        pytest.param(0, 120, 1, 0.0, id="refills-up-to-capacity"),
        pytest.param(10, 0, 100, 50.0, id="more-than-capacity-waits-for-a-full-bucket"),
    ],
)
def test_bucket(level: float, elapsed: float, amount: float, wait: float) -> None:
    bucket = Bucket(capacity=60, level=level, updated=0.0)  # 1 unit per second
    assert bucket.take(amount, elapsed) == pytest.approx(wait)


KEYS = """
tenants:
  team-a: {keys: [sk-a], requestsPerMinute: 2}
  team-b: {keys: [sk-b1, sk-b2], tokensPerMinute: 600}
  free: {keys: [sk-free]}
"""


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param("tenants: {a: {keys: []}}", "keys", id="no-keys"),
        pytest.param("tenants: {a: {keys: [k]}, b: {keys: [k]}}", "listed twice", id="dup-key"),
        pytest.param("tenants: {a: {keys: [k], rpm: 5}}", "rpm", id="unknown-field"),
        pytest.param(
            "tenants: {a: {keys: [k], requestsPerMinute: 0}}", "requestsPerMinute", id="0"
        ),
    ],
)
def test_keys_file_errors(text: str, fragment: str) -> None:
    with pytest.raises(TenantsError, match=fragment):
        Tenants.parse(text)


class FakeClock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def _app(clock: FakeClock) -> httpx.AsyncClient:
    service = Service("m", "ns", "svc", {"unified": Pool("unified", ("http://127.0.0.1:8001",))})
    app = create_app(
        GatewaySettings(),
        discovery=StaticDiscovery({"m": service}),
        transport=httpx.MockTransport(lambda _: httpx.Response(200, json={"ok": True})),
        tenants=Tenants.parse(KEYS, clock),
        clock=clock,
    )
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://gw")


def _statuses(clock: FakeClock, calls: list[tuple[str | None, int, float]]) -> list[int]:
    """Each call: (API key, max_tokens, clock time); returns the statuses in order."""

    async def run() -> list[int]:
        statuses = []
        async with _app(clock) as client:
            for key, max_tokens, at in calls:
                clock.now = at
                headers = {"authorization": f"Bearer {key}"} if key else {}
                body = {"model": "m", "prompt": "hi", "max_tokens": max_tokens}
                response = await client.post("/v1/completions", json=body, headers=headers)
                if response.status_code == 429:
                    assert int(response.headers["retry-after"]) >= 1
                    assert response.json()["error"]["code"] == "rate_limit_exceeded"
                statuses.append(response.status_code)
        return statuses

    return asyncio.run(run())


@pytest.mark.parametrize(
    ("calls", "expected"),
    [
        pytest.param([(None, 5, 0)], [401], id="no-key"),
        pytest.param([("sk-nope", 5, 0)], [401], id="unknown-key"),
        pytest.param([("sk-free", 5, 0)] * 5, [200] * 5, id="no-limits"),
        pytest.param(
            [("sk-a", 5, 0), ("sk-a", 5, 0), ("sk-a", 5, 0), ("sk-a", 5, 30)],
            [200, 200, 429, 200],
            id="requests-per-minute-then-refill",
        ),
        pytest.param(
            [("sk-b1", 250, 0), ("sk-b2", 250, 0), ("sk-b1", 250, 0), ("sk-free", 250, 0)],
            [200, 200, 429, 200],
            id="tokens-per-minute-shared-by-a-tenants-keys",
        ),
    ],
)
def test_keys_and_limits(calls: list[tuple[str | None, int, float]], expected: list[int]) -> None:
    assert _statuses(FakeClock(), calls) == expected
