"""The admin routes (/metrics, /docs, /redoc, /openapi.json) open, behind the API keys, or on a
port of their own; `/v1/models` and the completion routes by the caller's key. Each table is
asked of a real `llmfleet gateway` process over a static config and a stand-in engine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from llmfleet.gateway.app import create_app
from llmfleet.gateway.discovery import Pool, Role, Service, StaticDiscovery
from llmfleet.gateway.settings import GatewaySettings
from llmfleet.gateway.tenants import Tenants, TenantsError
from tests.gateway.servers import ThreadServer
from tests.gateway.standin import StandIn
from tests.net import free_port, status, wait_for

LLMFLEET = Path(sys.executable).parent / "llmfleet"
KEYS = """
tenants:
  team-a: {keys: [sk-a], models: [m1, m2]}
  ops: {keys: [sk-ops]}
"""
ADMIN = ("/metrics", "/docs", "/redoc", "/openapi.json")
Rows = dict[tuple[str, str, str | None], int]
"""(port: api or admin, path, API key) -> the status it must get."""


class Gateway:
    def __init__(self, port: int, admin_port: int | None) -> None:
        self.api = f"http://127.0.0.1:{port}"
        self.admin = f"http://127.0.0.1:{admin_port}" if admin_port else self.api


@contextmanager
def running(tmp_path: Path, **env: str) -> Iterator[Gateway]:
    """`llmfleet gateway` over models m1-m3 (one stand-in engine), API keys KEYS, `env` added
    (LLMFLEET_GATEWAY_ + the key); stopped with SIGTERM, as Kubernetes stops it."""
    with ThreadServer(StandIn("engine").app()) as engine:
        config = tmp_path / "fleet.yaml"
        config.write_text(
            "models:\n"
            + "".join(f"  {m}: {{unified: [{engine.url}]}}\n" for m in ("m1", "m2", "m3"))
        )
        keys = tmp_path / "keys.yaml"
        keys.write_text(KEYS)
        port = free_port()
        settings = {"STATIC_CONFIG": str(config), "API_KEYS_FILE": str(keys), "PORT": str(port)}
        settings |= env
        admin_port = int(env["ADMIN_PORT"]) if "ADMIN_PORT" in env else None
        environment = os.environ | {f"LLMFLEET_GATEWAY_{k}": v for k, v in settings.items()}
        log = tmp_path / "gateway.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [str(LLMFLEET), "gateway"], env=environment, stdout=out, stderr=subprocess.STDOUT
            )
        gateway = Gateway(port, admin_port)
        try:
            for url in {gateway.api, gateway.admin}:
                wait_for(partial(ready, url), 20, url)
            yield gateway
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=20)
            print(log.read_text())
        # Both servers shut down cleanly, then the captured SIGTERM reaches the default handler.
        assert process.returncode in (0, -signal.SIGTERM)
        for url in {gateway.api, gateway.admin}:
            assert status(f"{url}/healthz") is None, f"{url} still answers"


def ready(url: str) -> bool | None:
    return status(f"{url}/readyz") == 200 or None


def get(url: str, key: str | None) -> int:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.get(url, headers=headers, timeout=10).status_code


def table(gateway: Gateway, rows: Rows) -> None:
    actual = {
        (port, path, key): get(f"{getattr(gateway, port)}{path}", key) for port, path, key in rows
    }
    assert actual == rows


def test_admin_routes_are_open_by_default(tmp_path: Path) -> None:
    with running(tmp_path) as gateway:
        table(gateway, {("api", path, None): 200 for path in ADMIN})
        assert "llmfleet_gateway" in httpx.get(f"{gateway.api}/metrics").text


def test_admin_routes_behind_the_keys(tmp_path: Path) -> None:
    with running(tmp_path, ADMIN_REQUIRES_KEY="true") as gateway:
        rows: Rows = {("api", path, None): 401 for path in ADMIN}
        rows |= {("api", path, "sk-wrong"): 401 for path in ADMIN}
        rows |= {("api", path, "sk-a"): 200 for path in ADMIN}  # any tenant's key
        rows |= {("api", path, None): 200 for path in ("/healthz", "/readyz")}  # the probes
        table(gateway, rows)
        refused = httpx.get(f"{gateway.api}/metrics").json()["error"]
        assert refused["code"] == "invalid_api_key"


def test_admin_routes_on_their_own_port(tmp_path: Path) -> None:
    with running(tmp_path, ADMIN_PORT=str(free_port())) as gateway:
        rows: Rows = {("api", path, key): 404 for path in ADMIN for key in (None, "sk-ops")}
        rows |= {("admin", path, None): 200 for path in ADMIN}
        rows |= {(port, path, None): 200 for port in ("api", "admin")
                 for path in ("/healthz", "/readyz")}  # fmt: skip
        table(gateway, rows)
        # The admin port documents the API port's routes, and serves none of them.
        paths = httpx.get(f"{gateway.admin}/openapi.json").json()["paths"]
        assert {"/v1/chat/completions", "/v1/completions", "/v1/models"} <= set(paths)
        body = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}
        headers = {"authorization": "Bearer sk-a"}
        answer = httpx.post(f"{gateway.admin}/v1/chat/completions", json=body, headers=headers)
        assert answer.status_code == 404
        assert get(f"{gateway.admin}/v1/models", "sk-a") == 404
        answer = httpx.post(f"{gateway.api}/v1/chat/completions", json=body, headers=headers)
        assert answer.status_code == 200


def test_admin_port_and_keys_together(tmp_path: Path) -> None:
    with running(tmp_path, ADMIN_PORT=str(free_port()), ADMIN_REQUIRES_KEY="true") as gateway:
        rows: Rows = {("admin", path, None): 401 for path in ADMIN}
        rows |= {("admin", path, "sk-ops"): 200 for path in ADMIN}
        rows |= {("api", path, "sk-ops"): 404 for path in ADMIN}
        table(gateway, rows)


def models(gateway: Gateway, key: str | None) -> list[str] | int:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    response = httpx.get(f"{gateway.api}/v1/models", headers=headers)
    if response.status_code != 200:
        return response.status_code
    return [model["id"] for model in response.json()["data"]]


def complete(gateway: Gateway, key: str, model: str) -> tuple[int, str]:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    response = httpx.post(f"{gateway.api}/v1/chat/completions", json=body,
                          headers={"authorization": f"Bearer {key}"}, timeout=10)  # fmt: skip
    return response.status_code, response.json().get("error", {}).get("message", "")


def test_a_key_lists_and_uses_only_its_models(tmp_path: Path) -> None:
    with running(tmp_path) as gateway:
        assert {key: models(gateway, key) for key in (None, "sk-wrong", "sk-a", "sk-ops")} == {
            None: 401,
            "sk-wrong": 401,
            "sk-a": ["m1", "m2"],
            "sk-ops": ["m1", "m2", "m3"],
        }
        no_such = "the model `{}` does not exist or your API key may not use it"
        assert {
            (key, model): complete(gateway, key, model)
            for key, model in (("sk-a", "m1"), ("sk-a", "m3"), ("sk-a", "m9"), ("sk-ops", "m3"))
        } == {
            ("sk-a", "m1"): (200, ""),
            # Not its model: answered exactly as a model that does not exist.
            ("sk-a", "m3"): (404, no_such.format("m3")),
            ("sk-a", "m9"): (404, no_such.format("m9")),
            ("sk-ops", "m3"): (200, ""),
        }


def test_models_without_keys_lists_every_model() -> None:
    pools: dict[Role, Pool] = {"unified": Pool("unified", ("http://127.0.0.1:1",))}
    discovery = StaticDiscovery({m: Service(m, "ns", m, pools) for m in ("b", "a")})
    with ThreadServer(create_app(GatewaySettings(), discovery=discovery)) as server:
        listed = httpx.get(f"{server.url}/v1/models").json()["data"]
        assert [model["id"] for model in listed] == ["a", "b"]


def test_admin_routes_behind_keys_need_keys() -> None:
    with pytest.raises(ValueError, match="admin_requires_key needs API keys"):
        create_app(GatewaySettings(admin_requires_key=True), discovery=StaticDiscovery({}))
    # With keys it starts.
    tenants = Tenants.parse(KEYS)
    create_app(GatewaySettings(admin_requires_key=True), discovery=StaticDiscovery({}),
               tenants=tenants)  # fmt: skip


def test_the_admin_port_must_differ_from_the_port() -> None:
    with pytest.raises(ValidationError, match="admin_port must differ from port"):
        GatewaySettings(port=9000, admin_port=9000)


def test_a_tenant_with_an_empty_model_list_is_refused() -> None:
    with pytest.raises(TenantsError, match="models"):
        Tenants.parse("tenants: {a: {keys: [k], models: []}}")


def test_the_cli_says_what_is_missing_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "fleet.yaml"
    config.write_text("models:\n  m1:\n    unified: [http://127.0.0.1:1]\n")
    env = os.environ | {"LLMFLEET_GATEWAY_ADMIN_REQUIRES_KEY": "true"}
    result = subprocess.run(
        [str(LLMFLEET), "gateway", "--static-config", str(config)],
        check=False, capture_output=True, text=True, timeout=30, env=env,
    )  # fmt: skip
    assert result.returncode == 1
    assert "admin_requires_key needs API keys" in result.stderr
    assert "Traceback" not in result.stderr
