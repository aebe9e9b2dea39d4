"""The endpoint table's counts, ejection and staleness (injected clock); the /metrics parsing is
in test_engine_load.py."""

from __future__ import annotations

import dataclasses
import gc

from llmfleet.gateway.endpoints import EndpointTable, EngineLoad


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _table(clock: FakeClock) -> EndpointTable:
    return EndpointTable(eject_after_failures=2, eject_seconds=10, stale_seconds=5, clock=clock)


def test_ejection_after_consecutive_failures_for_a_while() -> None:
    clock = FakeClock()
    table = _table(clock)
    assert table.failed("a") is False
    table.succeeded("a")  # a success resets the streak
    assert table.failed("a") is False
    assert table.failed("a") is True
    assert table.candidates(["a"])[0].ejected
    clock.now += 10.1
    assert not table.candidates(["a"])[0].ejected
    assert table.ejections == 1


def test_stale_scrapes_read_as_unknown() -> None:
    clock = FakeClock()
    table = _table(clock)
    table.record_load("a", EngineLoad(waiting=5, running=1, kv_usage=0.5))
    assert table.candidates(["a"])[0].waiting == 5
    clock.now += 6
    candidate = table.candidates(["a"])[0]
    assert (candidate.waiting, candidate.kv_usage) == (0, 0)
    assert candidate.stale  # once scraped, then silent: not preferred by the healthy filter
    assert not table.candidates(["never-scraped"])[0].stale  # unknown is not stale


def test_a_scrape_keeps_its_figures_as_numbers_of_the_endpoints_state() -> None:
    """No figures object kept per endpoint (each would be one more for the collector to walk,
    10,000 at fleet scale): every field of the newest scrape is read back, and forgotten."""
    table = _table(FakeClock())
    table.record_load("a", EngineLoad(waiting=5, running=1, kv_usage=0.5))
    newest = EngineLoad(**{f.name: 7.0 + i for i, f in enumerate(dataclasses.fields(EngineLoad))})
    table.record_load("a", newest)
    assert table.fresh_loads(["a"])[0] == newest
    assert not any(isinstance(kept, EngineLoad) for kept in gc.get_referents(table.get("a")))
    table.forget_figures("a")
    assert table.fresh_loads(["a"])[0] is None
    assert table.get("a").load is None


def test_in_flight_counts_never_go_negative_and_forget_removed_endpoints() -> None:
    table = _table(FakeClock())
    table.begin("a", 100)
    table.begin("a", 50)
    table.end("a", 100)
    assert (table.get("a").in_flight, table.get("a").in_flight_tokens) == (1, 50)
    table.end("a", 50)
    table.end("a", 50)
    assert (table.get("a").in_flight, table.get("a").in_flight_tokens) == (0, 0)
    table.retain(["b"])
    table.end("a", 10)  # a request finishing on an endpoint that left: no error, no entry
    assert table.candidates(["b"])[0].url == "b"
