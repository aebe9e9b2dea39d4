"""bench/scrape_cost.py's bodies: the scraper finds the gauges in both, so every client's
scrape does the whole work (a body without them would time a cheaper parse)."""

from __future__ import annotations

import sys

import pytest

from llmfleet.gateway.endpoints import EngineLoad
from llmfleet.gateway.scraper import engine_load
from tests.unit.bench_modules import BENCH, load

sys.path.insert(0, str(BENCH))  # the script imports its neighbour `_support`
scrape_cost = load("scrape_cost")


@pytest.mark.parametrize("lines", [0, 1, 400])
def test_the_vllm_sized_body_carries_the_gauges_after_its_histograms(lines: int) -> None:
    body = scrape_cost.vllm_sized(lines)
    assert body.count("\n") == lines + 3
    assert body.index("vllm:num_requests_running") > body.rfind("_bucket")
    assert engine_load(body) == EngineLoad(waiting=1, running=3, kv_usage=0.25)


def test_the_gauges_body_is_what_the_scraper_reads() -> None:
    assert engine_load(scrape_cost.GAUGES) == EngineLoad(waiting=1, running=3, kv_usage=0.25)
