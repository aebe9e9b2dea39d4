"""API keys as a platform team runs them (issue 27, item 4): reloaded when their source changes
(keys added and revoked at once, buckets kept), limits divided among the gateway replicas, and
no gateway that runs open because its keys went missing."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import httpx
import pytest

from llmfleet.gateway.app import create_app
from llmfleet.gateway.discovery import StaticDiscovery
from llmfleet.gateway.keys_reload import KeysReloader
from llmfleet.gateway.settings import GatewaySettings
from llmfleet.gateway.tenants import Tenants
from tests.gateway.test_admin_routes import get, running
from tests.net import wait_for

ONE = "tenants:\n  a: {keys: [sk-a], requestsPerMinute: 2}\n"
TWO = "tenants:\n  a: {keys: [sk-a2], requestsPerMinute: 2}\n  b: {keys: [sk-b]}\n"


def test_a_reload_swaps_keys_and_keeps_each_tenants_bucket() -> None:
    tenants = Tenants.parse(ONE, clock=lambda: 0.0)
    a = tenants.identify("Bearer sk-a")
    assert a is not None
    assert [tenants.retry_after(a, 1) for _ in range(3)] == [0, 0, 30]
    tenants.reload(TWO)
    assert tenants.identify("Bearer sk-a") is None  # revoked
    b = tenants.identify("Bearer sk-b")
    assert b is not None
    assert tenants.retry_after(b, 1) == 0
    a2 = tenants.identify("Bearer sk-a2")
    assert a2 is not None
    assert tenants.retry_after(a2, 1) == 30  # still out of requests: the reload re-grants none


@pytest.mark.parametrize(
    ("replicas", "admitted"),
    [(1, 6), (2, 3), (3, 2)],
    ids=["one replica: the whole limit", "two: half each", "three: a third each"],
)
def test_each_replica_enforces_its_share_of_the_limit(replicas: int, admitted: int) -> None:
    tenants = Tenants.parse(
        "tenants:\n  a: {keys: [k], requestsPerMinute: 6}\n", lambda: 0.0, replicas
    )
    tenant = tenants.identify("Bearer k")
    assert tenant is not None
    answers = [tenants.retry_after(tenant, 1) for _ in range(admitted + 1)]
    assert answers[:admitted] == [0] * admitted
    assert answers[admitted] > 0


def test_a_source_that_fails_leaves_the_keys_in_force(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(ONE)
    reloader = KeysReloader(Tenants.parse(ONE), path.read_text, str(path), ONE)
    assert asyncio.run(reloader.once()) is False  # unchanged
    path.write_text("tenants: [")
    with caplog.at_level(logging.WARNING, "llmfleet.gateway.keys"):
        assert asyncio.run(reloader.once()) is False
        assert asyncio.run(reloader.once()) is False
    assert reloader.tenants.identify("Bearer sk-a") is not None
    assert len([r for r in caplog.records if "not reloaded" in r.message]) == 1  # said once
    path.unlink()
    assert asyncio.run(reloader.once()) is False
    assert reloader.tenants.identify("Bearer sk-a") is not None
    path.write_text(TWO)
    assert asyncio.run(reloader.once()) is True
    assert reloader.tenants.identify("Bearer sk-b") is not None


def test_required_keys_refuse_a_gateway_without_them() -> None:
    settings = GatewaySettings(require_api_keys=True)
    with pytest.raises(ValueError, match="require_api_keys"):
        create_app(settings, discovery=StaticDiscovery({}))


def test_required_keys_with_keys_serve(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(ONE)
    settings = GatewaySettings(require_api_keys=True, api_keys_file=path)
    app = create_app(settings, discovery=StaticDiscovery({}))

    async def models(key: str | None) -> int:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            headers = {"authorization": f"Bearer {key}"} if key else {}
            return (await client.get("/v1/models", headers=headers)).status_code

    assert asyncio.run(models(None)) == 401
    assert asyncio.run(models("sk-a")) == 200


def test_a_running_gateway_takes_a_changed_keys_file(tmp_path: Path) -> None:
    """A real `llmfleet gateway`: a key written into its keys file is accepted, and one taken
    out refused, without a restart."""
    with running(tmp_path, API_KEYS_RELOAD_SECONDS="0.2") as gateway:
        models = f"{gateway.api}/v1/models"
        assert get(models, "sk-new") == 401
        assert get(models, "sk-a") == 200
        (tmp_path / "keys.yaml").write_text("tenants:\n  new: {keys: [sk-new]}\n")
        wait_for(lambda: get(models, "sk-new") == 200 or None, 20, "the new key accepted")
        assert get(models, "sk-a") == 401
