"""The /metrics parser, the endpoint table's counts, ejection and staleness (injected clock)."""

from __future__ import annotations

import pytest

from llmfleet.gateway.endpoints import EndpointTable, EngineLoad, parse_engine_metrics

VLLM = """\
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="0",model_name="m"} 7.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.42
vllm:num_requests_waiting_by_reason{reason="capacity"} 99
vllm:prompt_tokens_total{model_name="m"} 1234
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(VLLM, EngineLoad(3, 7, 0.42), id="vllm"),
        pytest.param("", EngineLoad(), id="empty"),
        pytest.param(
            'vllm:num_requests_waiting{model_name="a"} 1\n'
            'vllm:num_requests_waiting{model_name="b"} 2\n'
            'vllm:kv_cache_usage_perc{model_name="a"} 0.2\n'
            'vllm:kv_cache_usage_perc{model_name="b"} 0.6\n',
            EngineLoad(waiting=3, kv_usage=0.6),
            id="sum-queues-max-kv",
        ),
        pytest.param(
            "vllm:num_requests_running 4 1700000000000\n",
            EngineLoad(running=4),
            id="no-labels-timestamp",
        ),
        pytest.param(
            'vllm:gpu_cache_usage_perc{model_name="m"} 0.3\n',
            EngineLoad(kv_usage=0.3),
            id="old-kv-name",
        ),
        pytest.param(
            'vllm:num_requests_running{model_name="m"} NaNx\nvllm:num_requests_waiting{x="}"} 2\n',
            EngineLoad(waiting=2),
            id="garbage-skipped-brace-in-label",
        ),
    ],
)
def test_parse_engine_metrics(text: str, expected: EngineLoad) -> None:
    assert parse_engine_metrics(text) == expected


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
