"""The one parser of vLLM's /metrics text (core): which lines it reads for a name, what it makes of
tricky labels and values, and the sums the operator's probe and the launcher's drain share."""

from __future__ import annotations

import math

import pytest

from llmfleet.core.vllm_metrics import (
    CACHE_CONFIG_INFO,
    GPU_CACHE_USAGE,
    KV_CACHE_USAGE,
    RUNNING,
    WAITING,
    Sample,
    highest,
    read,
    requests_in_engine,
    total,
)

MODEL = 'model_name="Qwen/Qwen3-8B"'

VLLM_TWO_ENGINES = f"""\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{{MODEL},engine="0"}} 3.0
vllm:num_requests_running{{{MODEL},engine="1"}} 4.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{{MODEL},engine="0"}} 0.0
vllm:num_requests_waiting{{{MODEL},engine="1"}} 2.0
# HELP vllm:num_requests_waiting_by_reason Number of requests waiting, by reason.
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{{{MODEL},engine="1",reason="capacity"}} 2.0
# HELP vllm:kv_cache_usage_perc KV-Cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{{MODEL},engine="0"}} 0.25
vllm:kv_cache_usage_perc{{{MODEL},engine="1"}} 0.625
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{{MODEL},engine="0"}} 1.0
vllm:num_preemptions_created{{{MODEL},engine="0"}} 1.7e+09
vllm:num_preemptions_total{{{MODEL},engine="1"}} 0.0
vllm:num_preemptions_created{{{MODEL},engine="1"}} 1.7e+09
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_sum{{{MODEL},engine="0"}} 9.53
vllm:time_to_first_token_seconds_bucket{{{MODEL},engine="0",le="0.001"}} 0.0
vllm:time_to_first_token_seconds_bucket{{{MODEL},engine="0",le="0.1"}} 98.0
vllm:time_to_first_token_seconds_bucket{{{MODEL},engine="0",le="+Inf"}} 127.0
vllm:time_to_first_token_seconds_count{{{MODEL},engine="0"}} 127.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="16",cache_dtype="fp8",enable_prefix_caching="True",\
engine="0",num_gpu_blocks="26306"}} 1.0
"""
"""Two data-parallel engines behind one port, in the shape vLLM's V1 engine exports (written
after its prometheus_client output: `_created` beside a counter, `+Inf` bucket, labels in the
order the metrics declare them)."""

SIMULATOR = """\
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig.
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",num_gpu_blocks="1024"} 1
# HELP vllm:e2e_request_latency_seconds Histogram of end to end request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{model_name="Qwen/Qwen3-0.6B",le="0.3"} 3
vllm:e2e_request_latency_seconds_sum{model_name="Qwen/Qwen3-0.6B"} 0.00033900499999999997
vllm:e2e_request_latency_seconds_count{model_name="Qwen/Qwen3-0.6B"} 3
# HELP vllm:kv_cache_usage_perc Prometheus metric for the fraction of KV-cache blocks currently \
in use (from 0 to 1).
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="Qwen/Qwen3-0.6B"} 0
# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="1",running_lora_adapters="",waiting_lora_adapters=""} \
1.795555113e+09
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="Qwen/Qwen3-0.6B"} 0
# HELP vllm:num_requests_waiting Prometheus metric for the number of queued requests.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="Qwen/Qwen3-0.6B"} 0
"""
"""An excerpt of llm-d-inference-sim v0.10.2's /metrics after three completions, as served."""


def _values(text: str, name: str) -> list[float]:
    return [sample.value for sample in read(text, (name,))[name]]


@pytest.mark.parametrize(
    ("text", "name", "expected"),
    [
        pytest.param(VLLM_TWO_ENGINES, RUNNING, [3, 4], id="vllm-one-sample-per-engine"),
        pytest.param(VLLM_TWO_ENGINES, WAITING, [0, 2], id="vllm-longer-name-is-another-series"),
        pytest.param(VLLM_TWO_ENGINES, GPU_CACHE_USAGE, [], id="vllm-absent-series"),
        pytest.param(VLLM_TWO_ENGINES, "vllm:num_preemptions_total", [1, 0], id="counter-total"),
        pytest.param(VLLM_TWO_ENGINES, "vllm:num_preemptions", [], id="counter-family-name-alone"),
        pytest.param(
            VLLM_TWO_ENGINES, "vllm:time_to_first_token_seconds_bucket", [0, 98, 127],
            id="histogram-buckets",
        ),
        pytest.param(
            VLLM_TWO_ENGINES, "vllm:time_to_first_token_seconds_count", [127],
            id="histogram-count",
        ),
        pytest.param(
            VLLM_TWO_ENGINES, "vllm:time_to_first_token_seconds", [], id="histogram-family",
        ),
        pytest.param(SIMULATOR, KV_CACHE_USAGE, [0], id="simulator-kv"),
        pytest.param(
            SIMULATOR, "vllm:e2e_request_latency_seconds_sum", [0.00033900499999999997],
            id="simulator-histogram-sum",
        ),
        pytest.param(
            SIMULATOR, "vllm:lora_requests_info", [1.795555113e9], id="empty-label-values",
        ),
        pytest.param("vllm:a 1\nvllm:a 2", "vllm:a", [1, 2], id="first-line-and-no-final-newline"),
        pytest.param("vllm:a 1\r\nvllm:a{x=\"y\"} 2\r\n", "vllm:a", [1, 2], id="crlf"),
        pytest.param("vllm:a\t7\nvllm:a{}  8  \n", "vllm:a", [7, 8], id="tabs-blanks-empty-labels"),
        pytest.param("vllm:a 4 1700000000000\n", "vllm:a", [4], id="timestamp"),
        pytest.param("vllm:a 4 noon\nvllm:a 4 5 6\n", "vllm:a", [], id="bad-timestamp-extra-field"),
        pytest.param("vllm:a\nvllm:a{}\nvllm:a{x=\"1\"}\n", "vllm:a", [], id="no-value"),
        pytest.param("vllm:a NaNx\nvllm:a 0x10\nvllm:a 1,5\n", "vllm:a", [], id="not-a-number"),
        pytest.param("vllm:a +Inf\nvllm:a -Inf\n", "vllm:a", [math.inf, -math.inf], id="inf"),
        pytest.param("vllm:a{x=\"1\" 2\nvllm:a{x=\"1} 3\n", "vllm:a", [], id="labels-unclosed"),
        pytest.param(
            "# TYPE vllm:a gauge\n# HELP vllm:a 5\n #vllm:a 6\n\nvllm:a 1\n", "vllm:a", [1],
            id="comments-and-blank-lines",
        ),
        pytest.param(
            'vllm:a{path="/x }"} 1\nvllm:a{q="say \\"}\\" twice"} 2\nvllm:a{h="# 9 9"} 3\n',
            "vllm:a", [1, 2, 3], id="brace-escaped-quote-hash-in-label-values",
        ),
        pytest.param(
            'vllm:a{slash="\\\\"} 1\nvllm:a{slash="\\\\\\"}"} 2\n', "vllm:a", [1, 2],
            id="escaped-backslash-before-closing-quote",
        ),
    ],
)  # fmt: skip
def test_read_finds_exactly_the_named_series(text: str, name: str, expected: list[float]) -> None:
    assert _values(text, name) == expected


def test_read_answers_every_name_asked_and_nan_is_kept() -> None:
    found = read("vllm:a NaN\nvllm:b 1\n", ("vllm:a", "vllm:c"))
    assert list(found) == ["vllm:a", "vllm:c"]
    assert math.isnan(found["vllm:a"][0].value)
    assert found["vllm:c"] == []


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        pytest.param(
            VLLM_TWO_ENGINES.splitlines()[-1],
            {"block_size": "16", "cache_dtype": "fp8", "enable_prefix_caching": "True",
             "engine": "0", "num_gpu_blocks": "26306"},
            id="vllm-info-metric",
        ),
        pytest.param("vllm:a 1", {}, id="none"),
        pytest.param('vllm:a{x="1",} 1', {"x": "1"}, id="trailing-comma"),
        pytest.param('vllm:a{ x = "a b" , y="}{"} 1', {"x": "a b", "y": "}{"}, id="blanks-braces"),
        pytest.param(
            'vllm:a{q="\\"hi\\"",n="1\\n2",s="c:\\\\d"} 1',
            {"q": '"hi"', "n": "1\n2", "s": "c:\\d"},
            id="escapes-undone",
        ),
    ],
)  # fmt: skip
def test_labels(line: str, expected: dict[str, str]) -> None:
    (sample,) = [sample for series in read(line, ("vllm:a", CACHE_CONFIG_INFO)).values()
                 for sample in series]  # fmt: skip
    assert sample.labels() == expected


@pytest.mark.parametrize(
    ("values", "expected_total", "expected_highest"),
    [
        pytest.param([], None, None, id="no-samples"),
        pytest.param([math.nan], None, None, id="only-nan"),
        pytest.param([1.0, math.nan, 2.0], 3.0, 2.0, id="nan-skipped"),
        pytest.param([0.2, 0.6], 0.8, 0.6, id="sum-vs-max"),
        pytest.param([1.0, math.inf], math.inf, math.inf, id="infinity-kept"),
    ],
)
def test_total_and_highest(
    values: list[float], expected_total: float | None, expected_highest: float | None
) -> None:
    samples = [Sample(value, "") for value in values]
    assert total(samples) == expected_total
    assert highest(samples) == expected_highest


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(VLLM_TWO_ENGINES, 9, id="vllm-two-engines"),
        pytest.param(SIMULATOR, 0, id="simulator-idle"),
        pytest.param("vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n", 0, id="idle"),
        pytest.param("vllm:num_requests_waiting 2\n", 2, id="one-gauge-only"),
        pytest.param("vllm:num_requests_running 2.9999999\n", 3, id="rounded"),
        pytest.param("process_cpu_seconds_total 1.0\n", None, id="not-an-engine"),
        pytest.param('vllm:num_requests_waiting{m="x"} NaN\n', None, id="nan-is-unknown"),
        pytest.param("vllm:num_requests_running +Inf\n", None, id="infinite-is-unknown"),
    ],
)
def test_requests_in_engine(text: str, expected: int | None) -> None:
    assert requests_in_engine(text) == expected
