"""LLMFLEET_LOOPBACK_ONLY: each component's clients refuse destinations outside 127.0.0.0/8 and
::1 before connecting; one warning per endpoint, one count per attempt (issue 11)."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest

from llmfleet.autoscaler.signals import PrometheusSignals, SignalsUnavailable
from llmfleet.core import loopback
from llmfleet.core.loopback import (
    GuardedTransport,
    LoopbackGuard,
    NonLocalConnectError,
    NonLocalRefused,
    guarded,
)
from llmfleet.operator.inflight import probe_in_flight
from tests.net import require_isolation


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("127.0.0.1", True),
        ("127.3.4.5", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("::1", True),
        ("[::1]", True),
        ("::ffff:127.0.0.1", True),
        ("10.0.0.5", False),
        ("192.0.2.200", False),
        ("0.0.0.0", False),
        ("::", False),
        ("2001:db8::1", False),
        ("::ffff:10.0.0.5", False),
        ("engine.ns.svc", False),
        ("localhost.example.com", False),
        ("127.0.0.1.nip.io", False),
        ("", False),
    ],
)
def test_what_counts_as_loopback(host: str, allowed: bool) -> None:
    assert loopback.is_loopback(host) is allowed


@pytest.mark.parametrize(
    ("value", "on"),
    [("true", True), ("1", True), ("YES", True), ("false", False), ("", False), ("0", False)],
)
def test_the_environment_switch(value: str, on: bool) -> None:
    assert loopback.enabled({loopback.ENV: value}) is on
    assert loopback.enabled({}) is False


def test_an_off_guard_refuses_nothing() -> None:
    refused: list[str] = []
    guard = LoopbackGuard(False, refused.append)
    guard.check("10.0.0.5", 8000, "upstream")
    guard.check_url("http://example.com/x")
    assert refused == []


def test_refusals_warn_once_per_endpoint_and_count_every_attempt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    refused: list[str] = []
    guard = LoopbackGuard(True, refused.append)
    with caplog.at_level(logging.WARNING, "llmfleet.loopback"):
        for _ in range(3):
            with pytest.raises(NonLocalRefused, match=r"10\.0\.0\.5:8000 is outside"):
                guard.check("10.0.0.5", 8000, "upstream")
        with pytest.raises(NonLocalRefused, match=r"\[2001:db8::1\]:80"):
            guard.check_url("http://[2001:db8::1]:80/metrics", "scrape")
        guard.check("127.0.0.1", 8000, "upstream")
    assert refused == ["upstream", "upstream", "upstream", "scrape"]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith("refusing connections to 10.0.0.5:8000 (upstream)")
    assert loopback.ENV in warnings[0]


def test_the_refusal_is_an_oserror_naming_the_switch() -> None:
    with pytest.raises(OSError, match=r"LLMFLEET_LOOPBACK_ONLY is on") as refused:
        LoopbackGuard(True).check("10.0.0.5", 80)
    assert isinstance(refused.value, NonLocalRefused)
    assert refused.value.endpoint == "10.0.0.5:80"


def test_the_transport_refuses_before_the_inner_one_sees_the_request() -> None:
    reached: list[str] = []

    def engine(request: httpx.Request) -> httpx.Response:
        reached.append(str(request.url))
        return httpx.Response(200, json={"ok": True})

    counted: list[str] = []
    transport = GuardedTransport(httpx.MockTransport(engine), LoopbackGuard(True, counted.append))

    async def run() -> int:
        async with httpx.AsyncClient(transport=transport) as client:
            with pytest.raises(NonLocalConnectError) as refused:
                await client.get("http://10.0.0.5:8000/metrics")
            assert isinstance(refused.value, httpx.ConnectError)
            return (await client.get("http://127.0.0.1:8000/metrics")).status_code

    assert asyncio.run(run()) == 200
    assert reached == ["http://127.0.0.1:8000/metrics"]
    assert counted == [""]


def test_guarded_leaves_the_transport_alone_when_off() -> None:
    mock = httpx.MockTransport(lambda _: httpx.Response(204))
    assert guarded(mock, LoopbackGuard(False)) is mock
    assert guarded(None, LoopbackGuard(False)) is None
    assert isinstance(guarded(None, LoopbackGuard(True)), GuardedTransport)


def test_the_operators_probe_is_refused_without_a_connection() -> None:
    require_isolation()  # were the guard broken, the probe would try 10.0.0.5
    counted: list[str] = []
    guard = LoopbackGuard(True, counted.append)
    assert probe_in_flight("10.0.0.5", 8000, timeout=0.2, guard=guard) is None
    assert counted == ["probe"]


def test_the_autoscalers_prometheus_client_is_refused_with_the_cause() -> None:
    require_isolation()
    counted: list[str] = []
    signals = PrometheusSignals(
        "http://10.0.0.5:9090", timeout_s=0.5, guard=LoopbackGuard(True, counted.append)
    )
    with pytest.raises(SignalsUnavailable, match=r"10\.0\.0\.5:9090 is outside 127\.0\.0\.0/8"):
        signals.read_all()
    signals.close()
    assert counted == ["prometheus"]
