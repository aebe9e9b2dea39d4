"""The simulator's routing profiles are the gateway's, and each one routes the replay."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmfleet.autoscaler.sim.cli import app
from llmfleet.autoscaler.sim.run import ROUTING_PROFILES
from llmfleet.core.errors import UserError
from llmfleet.gateway.settings import DEFAULT_PROFILES


@pytest.mark.parametrize("name", sorted(DEFAULT_PROFILES))
def test_the_simulators_profiles_are_the_gateways(name: str) -> None:
    gateway, sim = DEFAULT_PROFILES[name], ROUTING_PROFILES[name]
    assert (sim.filters, dict(sim.scorers), sim.picker) == (
        gateway.filters,
        gateway.scorers,
        gateway.picker,
    )
    assert set(ROUTING_PROFILES) == set(DEFAULT_PROFILES)


def _trace(tmp_path: Path) -> Path:
    """Three minutes of 4k-token prompts, 12 a second, each sharing one of 301 4-block
    prefixes (an odd count, so that round robin does not send a prefix to one engine by
    accident): 1,204 blocks, more than one engine's prefix cache holds (821), fewer than two
    hold. Two replicas or more, so routing has a choice: sent by prefix, each engine keeps its
    half."""
    path = tmp_path / "shared.jsonl"
    lines = [
        json.dumps(
            {
                "timestamp": i * 1000 // 12,
                "input_length": 4096,
                "output_length": 20,
                "hash_ids": [*(4 * (i % 301) + k for k in range(4)), 10_000 + i],
            }
        )
        for i in range(12 * 180)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_prefix_affinity_finds_more_of_the_shared_prefixes(tmp_path: Path) -> None:
    hits = {}
    for routing in ROUTING_PROFILES:
        result = CliRunner().invoke(
            app,
            [str(_trace(tmp_path)), "-p", "static-peak", "--routing", routing, "--json", "--quiet"],
        )
        assert result.exit_code == 0, result.output
        trace = json.loads(result.output)["traces"][0]
        assert trace["routing"] == routing
        (row,) = trace["policies"]
        assert row["prefixHitShare"] <= trace["prefixHitUpperBound"]
        hits[routing] = row["prefixHitShare"]
        assert trace["staticReplicas"] >= 2
    # Round robin thrashes both caches; least-loaded keeps some by chance.
    assert hits["prefix-load"] > 2 * hits["least-loaded"] > 2 * hits["round-robin"]


def test_an_unknown_profile_is_a_user_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, [str(_trace(tmp_path)), "--routing", "random", "--quiet"])
    assert isinstance(result.exception, UserError)
    assert "unknown routing profile 'random'" in str(result.exception)
