"""The static configuration file: what it may say, and the one-line errors when it is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmfleet.gateway.discovery import (
    Limits,
    StaticConfigError,
    StaticDiscovery,
    parse_static_config,
)

GOOD = """
models:
  small:
    unified: [http://127.0.0.1:8001/, http://127.0.0.1:8002]
    limits: {maxTokens: 512, timeoutSeconds: 30}
  big:
    namespace: prod
    service: big-svc
    prefill: [http://127.0.0.1:9001]
    decode: [http://127.0.0.1:9002]
"""


def test_static_config_maps_models_to_pools() -> None:
    services = parse_static_config(GOOD)
    small, big = services["small"], services["big"]
    assert small.pools["unified"].endpoints == ("http://127.0.0.1:8001", "http://127.0.0.1:8002")
    assert small.limits == Limits(512, 30)
    assert (small.namespace, small.name, small.disaggregated) == ("static", "small", False)
    assert (big.namespace, big.name, big.disaggregated) == ("prod", "big-svc", True)
    assert set(big.pools) == {"prefill", "decode"}


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param("models: {m: {}}", "needs `unified`", id="no-pools"),
        pytest.param(
            "models: {m: {unified: [http://a:1], decode: [http://b:1]}}", "not both", id="both"
        ),
        pytest.param("models: {m: {unified: [not a url]}}", "unified.0", id="bad-url"),
        pytest.param("models: {m: {unifed: [http://a:1]}}", "unifed", id="typo"),
        pytest.param("models: {m: {unified: [], limits: {maxTokens: 0}}}", "maxTokens", id="cap-0"),
        pytest.param("models: [", "invalid static config", id="not-yaml"),
        pytest.param("{}", "models", id="empty"),
    ],
)
def test_static_config_errors(text: str, fragment: str) -> None:
    with pytest.raises(StaticConfigError, match="invalid static config") as raised:
        parse_static_config(text)
    assert fragment in str(raised.value)


def test_static_discovery_from_file(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(GOOD)
    discovery = StaticDiscovery.from_file(path)
    assert discovery.ready()
    assert sorted(discovery.services()) == ["big", "small"]
    with pytest.raises(StaticConfigError, match="cannot read"):
        StaticDiscovery.from_file(tmp_path / "missing.yaml")
