"""The load the scraper reads out of an engine's /metrics text: queues summed, KV usage the max."""

from __future__ import annotations

import pytest

from llmfleet.gateway.endpoints import EngineLoad
from llmfleet.gateway.scraper import engine_load

VLLM = """\
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="0",model_name="m"} 7.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.42
vllm:num_requests_waiting_by_reason{reason="capacity"} 99
vllm:prompt_tokens_total{model_name="m"} 1234
"""

TWO_ENGINES = """\
vllm:num_requests_running{model_name="m",engine="0"} 3.0
vllm:num_requests_running{model_name="m",engine="1"} 4.0
vllm:num_requests_waiting{model_name="m",engine="0"} 0.0
vllm:num_requests_waiting{model_name="m",engine="1"} 2.0
vllm:kv_cache_usage_perc{model_name="m",engine="0"} 0.25
vllm:kv_cache_usage_perc{model_name="m",engine="1"} 0.625
vllm:gpu_cache_usage_perc{model_name="m",engine="1"} 0.9
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(VLLM, EngineLoad(3, 7, 0.42), id="vllm"),
        pytest.param(TWO_ENGINES, EngineLoad(2, 7, 0.625), id="two-engines-new-kv-name-wins"),
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
            'vllm:kv_cache_usage_perc{model_name="m"} NaN\n'
            'vllm:gpu_cache_usage_perc{model_name="m"} 0.3\n'
            'vllm:num_requests_waiting{model_name="m"} NaN\n',
            EngineLoad(kv_usage=0.3),
            id="nan-reads-as-absent",
        ),
        pytest.param(
            'vllm:num_requests_running{model_name="m"} NaNx\nvllm:num_requests_waiting{x="}"} 2\n',
            EngineLoad(waiting=2),
            id="garbage-skipped-brace-in-label",
        ),
    ],
)
def test_engine_load(text: str, expected: EngineLoad) -> None:
    assert engine_load(text) == expected
