"""Settings from the environment (LLMFLEET_GATEWAY_*), and profiles checked at start-up."""

from __future__ import annotations

import os
import subprocess
import sys

import prometheus_client
import pytest
from pydantic import ValidationError

from llmfleet.gateway.app import create_app
from llmfleet.gateway.discovery import StaticDiscovery
from llmfleet.gateway.routing.registry import UnknownPluginError
from llmfleet.gateway.server import process_wide
from llmfleet.gateway.settings import GatewaySettings, ProfileConfig


def test_profiles_and_numbers_from_the_environment() -> None:
    # A subprocess: the environment is the seam, and this process's stays untouched.
    code = (
        "from llmfleet.gateway.settings import GatewaySettings as S; s = S(); "
        "print(s.profile, s.profiles['mine'].scorers, s.max_tokens, s.upstream_client)"
    )
    env = {
        **os.environ,
        "LLMFLEET_GATEWAY_PROFILE": "mine",
        "LLMFLEET_GATEWAY_PROFILES": '{"mine": {"scorers": {"kv-cache": 2}}}',
        "LLMFLEET_GATEWAY_MAX_TOKENS": "64",
        "LLMFLEET_GATEWAY_UPSTREAM_CLIENT": "httpx",
    }
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert result.stdout.split() == ["mine", "{'kv-cache':", "2.0}", "64", "httpx"]


@pytest.mark.parametrize(
    ("profile", "error", "fragment"),
    [
        pytest.param(
            ProfileConfig(scorers={"prefix": 1.0}), UnknownPluginError, "scorer 'prefix'", id="s"
        ),
        pytest.param(ProfileConfig(filters=("alive",)), UnknownPluginError, "filter", id="f"),
        pytest.param(ProfileConfig(picker="best"), UnknownPluginError, "picker 'best'", id="p"),
    ],
)
def test_unknown_plugins_fail_at_start_up(
    profile: ProfileConfig, error: type[Exception], fragment: str
) -> None:
    settings = GatewaySettings(profile="bad", profiles={"bad": profile})
    with pytest.raises(error, match=fragment):
        create_app(settings, discovery=StaticDiscovery({}))


def test_unknown_profile_fails_at_start_up() -> None:
    with pytest.raises(ValueError, match="unknown routing profile 'fastest'"):
        create_app(GatewaySettings(profile="fastest"), discovery=StaticDiscovery({}))


def test_the_gateway_process_gives_the_loop_the_gil_back_within_a_millisecond(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`server.process_wide` sets the GIL's switch interval from the settings (Python's default
    is 5 ms: a worker thread's rebuild then held the event loop twice as long)."""
    # process_wide also turns prometheus_client's `_created` series off: back on after the test
    monkeypatch.setattr(
        prometheus_client.metrics, "_use_created", prometheus_client.metrics._use_created
    )
    before = sys.getswitchinterval()
    try:
        process_wide(GatewaySettings())
        assert sys.getswitchinterval() == pytest.approx(0.001)
        process_wide(GatewaySettings(gil_switch_interval_seconds=0.002))
        assert sys.getswitchinterval() == pytest.approx(0.002)
    finally:
        sys.setswitchinterval(before)
    with pytest.raises(ValidationError):
        GatewaySettings(gil_switch_interval_seconds=0)
