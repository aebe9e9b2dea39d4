"""The static configuration file: what it may say, and the one-line errors when it is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmfleet.crds.policy import DebounceMode
from llmfleet.gateway.discovery import (
    StaticConfigError,
    StaticDiscovery,
    parse_static_config,
)

GOOD = """
models:
  small:
    unified: [http://127.0.0.1:8001/, http://127.0.0.1:8002]
    traffic:
      limits: {maxTokens: 512, timeoutSeconds: 30}
      debounce: {mode: LatestWins, windowMs: 200}
  big:
    namespace: prod
    service: big-svc
    prefill: [http://127.0.0.1:9001]
    decode: [http://127.0.0.1:9002]
    slo: {maxKvCacheUsage: 0.5}
"""


def test_static_config_maps_models_to_pools() -> None:
    services = parse_static_config(GOOD)
    small, big = services["small"], services["big"]
    assert small.pools["unified"].endpoints == ("http://127.0.0.1:8001", "http://127.0.0.1:8002")
    assert (small.limits.max_tokens, small.limits.timeout_seconds) == (512, 30)
    assert small.traffic.debounce.mode == DebounceMode.LATEST_WINS
    assert small.traffic.debounce.window_ms == 200
    assert not small.traffic.coalesce.enabled  # the API's defaults
    assert big.slo.max_kv_cache_usage == 0.5
    assert StaticDiscovery(services).by_name("prod", "big-svc") is big
    assert (small.namespace, small.name, small.disaggregated) == ("static", "small", False)
    assert (big.namespace, big.name, big.disaggregated) == ("prod", "big-svc", True)
    assert set(big.pools) == {"prefill", "decode"}


@pytest.mark.parametrize(
    ("text", "lines"),
    [
        pytest.param(
            "models: {m: {}}",
            ["models.m: a model needs `unified` or `prefill` and `decode` endpoints"],
            id="no-pools",
        ),
        pytest.param(
            "models: {m: {unified: [http://a:1], decode: [http://b:1]}}",
            ["models.m: a model has either `unified` or `prefill`/`decode` pools, not both"],
            id="both",
        ),
        pytest.param(
            "models: {m: {unified: [not a url, 'ftp://x:1']}}",
            [
                "models.m.unified[0]: not a URL (relative URL without a base): 'not a url'",
                "models.m.unified[1]: the URL's scheme must be 'http' or 'https', got 'ftp://x:1'",
            ],
            id="bad-urls",
        ),
        pytest.param(
            "models: {m: {unifed: [http://a:1]}}", ["models.m.unifed: unknown key"], id="typo"
        ),
        pytest.param(
            "models: {m: {unified: [], traffic: {limits: {maxTokens: 0, timeoutSeconds: soon}}}}",
            [
                "models.m.traffic.limits.maxTokens: must be at least 1, got 0",
                "models.m.traffic.limits.timeoutSeconds: must be a number, got 'soon'",
            ],
            id="limits",
        ),
        pytest.param(
            "models: {m: {unified: http://a:1}}",
            ["models.m.unified: must be a list, got 'http://a:1'"],
            id="not-a-list",
        ),
        pytest.param(
            "models: {meta-llama/Llama-3.1-8B: {prefill: [x], decode: [http://b:1]}}",
            [
                'models["meta-llama/Llama-3.1-8B"].prefill[0]: '
                "not a URL (relative URL without a base): 'x'"
            ],
            id="model-name-quoted",
        ),
        pytest.param(
            "models: [",
            ["line 1, column 10: not YAML: expected the node content, but found '<stream end>'"],
            id="not-yaml",
        ),
        pytest.param("{}", ["models: required"], id="empty"),
        pytest.param("", ["must be a mapping, got nothing"], id="empty-file"),
    ],
)
def test_static_config_errors_are_one_line_per_problem(text: str, lines: list[str]) -> None:
    with pytest.raises(StaticConfigError) as raised:
        parse_static_config(text, "fleet.yaml")
    assert str(raised.value).splitlines() == [f"fleet.yaml: {line}" for line in lines]


def test_static_discovery_from_file(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(GOOD)
    discovery = StaticDiscovery.from_file(path)
    assert discovery.ready()
    assert sorted(discovery.services()) == ["big", "small"]
    with pytest.raises(StaticConfigError, match="cannot read"):
        StaticDiscovery.from_file(tmp_path / "missing.yaml")
