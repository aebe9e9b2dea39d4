"""The simulated gateway's view of the engines: scraped figures as old as `scrape_s` says, and
in-flight counts per gateway replica (`SimSettings.scrape_s`, `gateway_replicas`)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmfleet.autoscaler.sim.cli import app
from llmfleet.autoscaler.sim.engine import Recorder
from llmfleet.autoscaler.sim.fleet import Pool
from llmfleet.autoscaler.sim.model import EngineModel
from llmfleet.autoscaler.sim.run import ROUTING_PROFILES, Gateway
from llmfleet.autoscaler.sim.traces import Request, Trace


def _gateway(scrape_s: float, replicas: int) -> tuple[Gateway, Pool]:
    """Two serving pods, and four 1,000-token requests arriving at once."""
    pool = Pool(EngineModel(), Recorder(), prefix_cache=False, active=2, spares=0)
    trace = Trace("t", "azure", tuple(Request(0.0, 1000, 10) for _ in range(4)))
    profile = ROUTING_PROFILES["least-loaded"]
    gateway = Gateway(trace, pool, seed=0, profile=profile, scrape_s=scrape_s, replicas=replicas)
    return gateway, pool


def _seen(gateway: Gateway, pool: Pool, replica: int) -> tuple[float, int]:
    """Waiting requests and in-flight requests over both pods, as `replica` sees them."""
    candidates = gateway.candidates(replica, pool.serving())
    return sum(c.waiting for c in candidates), sum(c.in_flight for c in candidates)


@pytest.mark.parametrize(
    ("scrape_s", "replicas", "before", "after_scrape"),
    [
        # (waiting, in flight) seen by each replica, after 2 requests, then after a scrape
        pytest.param(0.0, 1, [(2, 2)], [(2, 2)], id="ideal-one-gateway"),
        pytest.param(5.0, 1, [(0, 2)], [(2, 2)], id="scraped-one-gateway"),
        pytest.param(math.inf, 1, [(0, 2)], [(0, 2)], id="never-one-gateway"),
        pytest.param(0.0, 2, [(2, 1), (2, 1)], [(2, 1), (2, 1)], id="ideal-two-gateways"),
        pytest.param(5.0, 2, [(0, 1), (0, 1)], [(2, 1), (2, 1)], id="scraped-two-gateways"),
        pytest.param(math.inf, 2, [(0, 1), (0, 1)], [(0, 1), (0, 1)], id="never-two-gateways"),
    ],
)
def test_what_each_gateway_replica_sees(
    scrape_s: float,
    replicas: int,
    before: list[tuple[float, int]],
    after_scrape: list[tuple[float, int]],
) -> None:
    gateway, pool = _gateway(scrape_s, replicas)
    assert gateway.next_scrape == (5.0 if scrape_s == 5.0 else math.inf)
    if scrape_s == 5.0:
        gateway.scrape()  # at start: nothing queued yet
        assert gateway.next_scrape == 10.0
    gateway.route(0, 0.0)
    gateway.route(1, 0.0)
    assert [_seen(gateway, pool, r) for r in range(replicas)] == before
    if scrape_s == 5.0:
        gateway.scrape()
    assert [_seen(gateway, pool, r) for r in range(replicas)] == after_scrape
    for pod in pool.pods:
        pod.engine.advance(600.0)  # both requests finish
    assert all(_seen(gateway, pool, r)[1] == 0 for r in range(replicas))


def test_the_cli_says_how_old_the_figures_are(tmp_path: Path) -> None:
    path = tmp_path / "small.jsonl"
    lines = [
        json.dumps({"timestamp": i * 500, "input_length": 2000, "output_length": 20,
                    "hash_ids": [i % 3, 100 + i]})
        for i in range(240)
    ]  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    runner = CliRunner()
    common = [str(path), "-p", "llmfleet", "--quiet"]
    shown = runner.invoke(app, [*common, "--scrape-seconds", "5", "--gateway-replicas", "2"])
    assert shown.exit_code == 0, shown.output
    assert "scraped figures refreshed every 5 s, 2 gateway replicas" in shown.output
    never = runner.invoke(app, [*common, "--scrape-seconds", "inf", "--json"])
    assert never.exit_code == 0, never.output
    document = json.loads(never.output)["traces"][0]
    assert (document["scrapeSeconds"], document["gatewayReplicas"]) == (None, 1)
    (row,) = document["policies"]
    assert row["ttftAttainmentPct"] > 0
