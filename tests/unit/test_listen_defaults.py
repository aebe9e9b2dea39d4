"""Every component listens on loopback and a port of its own by default, so the gateway, the
operator and the autoscaler started side by side on one machine never collide."""

from __future__ import annotations

import pytest
from pydantic_settings import BaseSettings

from llmfleet.autoscaler.settings import AutoscalerSettings
from llmfleet.gateway.settings import GatewaySettings
from llmfleet.operator.settings import OperatorSettings

LISTENERS: list[tuple[type[BaseSettings], str, str, int]] = [
    (GatewaySettings, "host", "port", 8080),
    (OperatorSettings, "metrics_host", "metrics_port", 8081),
    (AutoscalerSettings, "metrics_host", "metrics_port", 8082),
]


@pytest.mark.parametrize(
    ("settings", "host", "port", "expected"),
    [pytest.param(*row, id=row[0].__name__) for row in LISTENERS],
)
def test_default_address(settings: type[BaseSettings], host: str, port: str, expected: int) -> None:
    fields = settings.model_fields
    assert fields[host].default == "127.0.0.1"
    assert fields[port].default == expected


def test_no_two_components_share_a_default_port() -> None:
    ports = [settings.model_fields[port].default for settings, _, port, _ in LISTENERS]
    assert len(set(ports)) == len(ports)
