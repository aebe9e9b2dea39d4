"""bench/_fleet_load.py: how the scale benchmark spreads its load over services and gateways."""

from __future__ import annotations

import itertools
import json
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from _fleet_load import popularity, requests_for


@pytest.mark.parametrize("count", [1, 10, 1000])
def test_popularity_is_a_cumulative_share_ending_at_one(count: int) -> None:
    shares = popularity(count)
    assert len(shares) == count
    assert all(a < b for a, b in itertools.pairwise(shares))
    assert shares[-1] == pytest.approx(1.0)


def test_requests_take_the_replicas_in_turn_and_favour_a_few_services() -> None:
    models = [f"org/model-{i}" for i in range(100)]
    chosen = requests_for(["http://a", "http://b"], models, 20_000)
    assert [r.url for r in chosen[:4]] == ["http://a/v1/completions", "http://b/v1/completions"] * 2
    asked = Counter(json.loads(r.body)["model"] for r in chosen)
    ranked = [count for _, count in asked.most_common()]
    # 1/k over 100 services: the most popular gets ~19%, and nearly every service gets some.
    assert 0.15 < ranked[0] / len(chosen) < 0.24
    assert len(asked) >= 95
    # Popularity does not follow the names (the first service is not the most asked for).
    assert asked.most_common(1)[0][0] != "org/model-0"
    assert requests_for(["http://a"], models, 50) == requests_for(["http://a"], models, 50)
