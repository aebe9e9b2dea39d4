"""Canary analysis against a real Prometheus: simulator engines labelled with their revision,
the real gateway in front of them splitting each service's sessions 50/50, Prometheus scraping
both, and the operator's analyst comparing canary and stable over the same window.

Three services at once (one load, one window): a healthy canary, a canary whose engines
generate four times slower (ITL 80 ms against 20 ms), and one whose engines fail 40% of
requests with a 5xx. The simulator records its configured latencies exactly, so each p95 is
what `histogram_quantile` interpolates inside vLLM's buckets: ITL 20 ms falls in
(0.01, 0.025], 80 ms in (0.075, 0.1].
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmfleet.crds import InferenceService, InferenceServiceSpec
from llmfleet.gateway.discovery import Pool, Service, Split, StaticDiscovery
from llmfleet.operator.analyst import PrometheusAnalyst
from llmfleet.operator.rollout import Verdict
from tests.autoscaler.prom import Engine, Prometheus, Target
from tests.gateway.servers import gateway
from tests.net import free_port, wait_for

WINDOW_S = 6
STABLE, CANARY = "stable0001", "canary0001"
FAST = ("--time-to-first-token", "30ms", "--inter-token-latency", "20ms")
SLOW = ("--time-to-first-token", "30ms", "--inter-token-latency", "80ms")
FAILING = (*FAST, "--failure-injection-rate", "40", "--failure-types", "server_error")
SERVICES = {"healthy": FAST, "slow": SLOW, "failing": FAILING}


def _spec(**analysis: Any) -> InferenceServiceSpec:
    rollout = {"analysis": {"intervalSeconds": WINDOW_S, "minRequests": 15} | analysis}
    return InferenceService.model_validate(
        {"spec": {"model": {"name": "m"}, "rollout": rollout}}
    ).spec


def _engine(binary: Path, service: str, revision: str, flags: tuple[str, ...]) -> Engine:
    engine = Engine(binary, namespace="team", service=service, pool="unified", model=service,
                    flags=flags)  # fmt: skip
    engine.target = Target(engine.target.address, engine.target.labels | {"revision": revision})
    return engine


def _discovery(engines: dict[str, tuple[Engine, Engine]]) -> StaticDiscovery:
    services = {}
    for name, (stable, canary) in engines.items():

        def pools(engine: Engine) -> dict[Any, Pool]:
            return {"unified": Pool("unified", (engine.url,))}

        canary_service = Service(name, "team", name, pools(canary), revision=CANARY)
        services[name] = Service(name, "team", name, pools(stable), revision=STABLE,
                                 canary=Split.of(canary_service, 50))  # fmt: skip
    return StaticDiscovery(services)


def _load(url: str, models: list[str], stop: threading.Event) -> None:
    """Closed-loop streamed chat completions, one session each, round-robin over `models`."""
    with httpx.Client(base_url=url, timeout=30) as client:
        sent = 0
        while not stop.is_set():
            body = {"model": models[sent % len(models)], "max_tokens": 5, "stream": True,
                    "messages": [{"role": "user", "content": "hello there"}]}  # fmt: skip
            headers = {"x-session-id": str(uuid.uuid4())}
            with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
                r.read()
            sent += 1


@pytest.fixture
def engines(sim_binary: Path) -> Iterator[dict[str, tuple[Engine, Engine]]]:
    started: dict[str, tuple[Engine, Engine]] = {}
    try:
        for name, flags in SERVICES.items():
            started[name] = (_engine(sim_binary, name, STABLE, FAST),
                             _engine(sim_binary, name, CANARY, flags))  # fmt: skip
        yield started
    finally:
        for pair in started.values():
            for engine in pair:
                engine.stop()


def test_canary_and_stable_compared_over_the_same_window(
    prometheus_binary: Path, tmp_path: Path, engines: dict[str, tuple[Engine, Engine]]
) -> None:
    every = [engine for pair in engines.values() for engine in pair]
    with (
        Prometheus(prometheus_binary, tmp_path / "prometheus") as prom,
        gateway(_discovery(engines)) as server,
    ):
        prom.set_targets(every, exporters=[Target(f"127.0.0.1:{server.port}")])
        prom.wait_scraped(every)
        analyst = PrometheusAnalyst(prom.url)
        stop = threading.Event()
        workers = [
            threading.Thread(target=_load, args=(server.url, list(SERVICES), stop))
            for _ in range(6)
        ]
        for worker in workers:
            worker.start()
        try:
            time.sleep(WINDOW_S)

            def analysed() -> tuple[dict[str, Any], dict[str, Any]] | None:
                """Each service's verdict once every one has its requests (a loaded machine
                serves fewer in the window: the test waits for them, it does not sample once)."""
                found = {name: analyst.analyse(_spec(), "team", name, CANARY) for name in SERVICES}
                figures = analyst.measure("team", "slow", CANARY, WINDOW_S)
                enough = all(a.verdict != Verdict.WAIT for a in found.values())
                return (found, figures) if enough and figures["canary"].requests >= 15 else None

            verdicts, figures = wait_for(analysed, 60, "verdicts on enough requests", every=1)
            starved = analyst.analyse(_spec(minRequests=100_000), "team", "healthy", CANARY)
        finally:
            stop.set()
            for worker in workers:
                worker.join(timeout=30)
            analyst.close()

    healthy, slow, failing = verdicts["healthy"], verdicts["slow"], verdicts["failing"]
    assert healthy.verdict == Verdict.PASS, healthy.summary
    assert slow.verdict == Verdict.FAIL, slow.summary
    # (0.075, 0.1] against (0.01, 0.025]: both quantiles near their bucket's top.
    assert re.fullmatch(r"ITL p95 of the canary 9\d\.\d ms exceeds 1\.5 x the stable revision's "
                        r"2[34]\.\d ms \(spec\.rollout\.analysis\.maxLatencyRatio\)",
                        slow.failed), slow.failed  # fmt: skip
    assert failing.verdict == Verdict.FAIL, failing.summary
    assert failing.failed.startswith("error rate of the canary "), failing.failed
    assert "exceeds 1.0%" in failing.failed
    # Both sides served; the canary's share is about half (sessions split 50/50).
    canary, stable = figures["canary"], figures["stable"]
    assert canary.requests >= 15
    assert 0.3 < canary.requests / (canary.requests + stable.requests) < 0.7
    assert (canary.errors, stable.errors) == (0, 0)
    assert starved.verdict == Verdict.WAIT
    assert "of the 100000 requests a verdict needs" in starved.summary


def test_an_unreachable_prometheus_is_unavailable_not_a_verdict() -> None:
    analyst = PrometheusAnalyst(f"http://127.0.0.1:{free_port()}", timeout_s=2)
    started = time.monotonic()
    analysis = analyst.analyse(_spec(), "team", "healthy", CANARY)
    assert analysis.verdict == Verdict.UNAVAILABLE
    assert "Connection refused" in analysis.summary
    assert time.monotonic() - started < 3
