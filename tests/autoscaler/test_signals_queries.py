"""The signals layer's pure parts (label matchers, the PromQL per signal, parsing the answer) and
its one error message."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from typing import Any, ClassVar

import pytest

from llmfleet.autoscaler.goodput import LatencyHistogram
from llmfleet.autoscaler.inputs import PoolSignals
from llmfleet.autoscaler.signals import (
    Chunk,
    PoolKey,
    PrometheusSignals,
    QueryOptions,
    SignalsUnavailable,
    chunks,
    combined_query,
    matchers,
    parse,
    signal_queries,
)
from tests.net import free_port, posted_query, served

BY = "namespace, llmfleet_dev_service, llmfleet_dev_pool"
M = 'llmfleet_dev_service!=""'


@pytest.mark.parametrize(
    ("namespace", "service", "expected"),
    [
        pytest.param(None, None, M, id="every-service"),
        pytest.param("ns", None, f'{M},namespace="ns"', id="one-namespace"),
        pytest.param("ns", "chat", f'{M},namespace="ns",llmfleet_dev_service="chat"', id="one"),
        pytest.param("n", 'a"b\\', f'{M},namespace="n",llmfleet_dev_service="a\\"b\\\\"', id="esc"),
    ],
)
def test_matchers(namespace: str | None, service: str | None, expected: str) -> None:
    assert matchers(namespace, service) == expected


@pytest.mark.parametrize(
    ("services", "expected"),
    [
        pytest.param(["a"], f'{M},llmfleet_dev_service=~"a"', id="one"),
        pytest.param(["svc-1", "svc-2"], f'{M},llmfleet_dev_service=~"svc-1|svc-2"', id="two"),
        # RE2's specials escaped (a name is a DNS subdomain: '.' is the one it may hold), then
        # the backslash escaped for the PromQL string.
        pytest.param(["a.b", "c"], f'{M},llmfleet_dev_service=~"a\\\\.b|c"', id="dot"),
        pytest.param(["a|b*"], f'{M},llmfleet_dev_service=~"a\\\\|b\\\\*"', id="specials"),
    ],
)
def test_a_service_regex_matches_the_names_alone(services: list[str], expected: str) -> None:
    assert matchers(services=services) == expected


def ns(name: str) -> str:
    return matchers(name)


def regex(name: str, *services: str) -> str:
    return matchers(name, services=services)


@pytest.mark.parametrize(
    ("wanted", "size", "expected"),
    [
        pytest.param([], 2, [], id="none"),
        pytest.param(
            [("a", "x"), ("a", "y")], 2, [Chunk(ns("a"), (("a", "x"), ("a", "y")))],
            id="fits-one-namespace",
        ),
        pytest.param(
            [("b", "y"), ("a", "x")], 2, [Chunk(M, (("a", "x"), ("b", "y")))],
            id="fits-every-namespace",
        ),
        pytest.param(
            [("a", n) for n in "edcba"], 2,
            [
                Chunk(regex("a", "a", "b"), (("a", "a"), ("a", "b"))),
                Chunk(regex("a", "c", "d"), (("a", "c"), ("a", "d"))),
                Chunk(regex("a", "e"), (("a", "e"),)),
            ],
            id="runs-in-name-order",
        ),
        pytest.param(
            [("b", "p"), ("a", "x"), ("b", "q"), ("b", "r")], 2,
            [
                Chunk(ns("a"), (("a", "x"),)),
                Chunk(regex("b", "p", "q"), (("b", "p"), ("b", "q"))),
                Chunk(regex("b", "r"), (("b", "r"),)),
            ],
            id="a-namespace-that-fits-by-its-name-alone",
        ),
    ],
)  # fmt: skip
def test_chunks(wanted: list[tuple[str, str]], size: int, expected: list[Chunk]) -> None:
    assert chunks(wanted, size) == expected


def test_chunks_of_nothing_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        chunks([("a", "x")], 0)


QUERIES = signal_queries(
    QueryOptions(
        rate_window="30s", mean_window="5m", quantile=0.9, peak_window="10s", peak_step="5s"
    ),
    M,
)


@pytest.mark.parametrize(
    ("signal", "expected"),
    [
        ("observed_at", f"max by ({BY}) (timestamp(vllm:num_requests_running{{{M}}}))"),
        ("request_rate", f"sum by ({BY}) (rate(vllm:request_success_total{{{M}}}[30s]))"),
        ("prompt_tokens_rate", f"sum by ({BY}) (rate(vllm:prompt_tokens_total{{{M}}}[30s]))"),
        (
            "peak_prompt_tokens_rate",
            f"max_over_time((sum by ({BY}) (rate(vllm:prompt_tokens_total{{{M}}}[10s])))[30s:5s])",
        ),
        (
            "mean_prompt_tokens",
            f"sum by ({BY}) (increase(vllm:request_prompt_tokens_sum{{{M}}}[5m]))"
            f" / sum by ({BY}) (increase(vllm:request_prompt_tokens_count{{{M}}}[5m]))",
        ),
        (
            "mean_output_tokens",
            f"sum by ({BY}) (increase(vllm:request_generation_tokens_sum{{{M}}}[5m]))"
            f" / sum by ({BY}) (increase(vllm:request_generation_tokens_count{{{M}}}[5m]))",
        ),
        ("running", f"sum by ({BY}) (vllm:num_requests_running{{{M}}})"),
        ("waiting", f"sum by ({BY}) (vllm:num_requests_waiting{{{M}}})"),
        ("preemption_rate", f"sum by ({BY}) (rate(vllm:num_preemptions_total{{{M}}}[30s]))"),
        (
            "ttft_buckets",
            f"sum by ({BY}, le) (increase(vllm:time_to_first_token_seconds_bucket{{{M}}}[30s]))",
        ),
        (
            # Prompts whose own prefill misses the TTFT target (`goodput.capacity_misses`).
            "prefill_buckets",
            f"sum by ({BY}, le) (increase(vllm:request_prefill_time_seconds_bucket{{{M}}}[30s]))",
        ),
        (
            # The ITL histogram's and quantile's sources, each read once; `parse` picks.
            "itl_request_buckets",
            f"sum by ({BY}, le) (increase("
            f"vllm:request_time_per_output_token_seconds_bucket{{{M}}}[30s]))",
        ),
        (
            "itl_gap_buckets",
            f"sum by ({BY}, le) (increase(vllm:inter_token_latency_seconds_bucket{{{M}}}[30s]))",
        ),
        (
            "tpot_buckets",
            f"sum by ({BY}, le) (increase(vllm:time_per_output_token_seconds_bucket{{{M}}}[30s]))",
        ),
    ],
)
def test_signal_queries(signal: str, expected: str) -> None:
    assert QUERIES[signal] == expected


def test_no_bucket_series_is_read_twice() -> None:
    # Each histogram's buckets once in the whole pass (the quantiles come from them in `parse`).
    combined = combined_query(QUERIES)
    for name in ("time_to_first_token", "inter_token_latency", "request_time_per_output_token"):
        assert combined.count(f"vllm:{name}_seconds_bucket") == 1
    assert "histogram_quantile" not in combined


def test_kv_usage_is_the_mean_over_busy_pods_and_zero_when_none_is() -> None:
    query = QUERIES["kv_cache_usage"]
    assert query.startswith(f"(sum by ({BY}) (vllm:kv_cache_usage_perc{{{M}}}) / count by ({BY})")
    assert f"(sum by ({BY}, instance) (vllm:kv_cache_usage_perc{{{M}}}) > 0)" in query
    assert query.endswith(f" or (0 * sum by ({BY}) (vllm:kv_cache_usage_perc{{{M}}}))")


def test_gpu_utilisation_joins_dcgm_on_the_pod() -> None:
    query = QUERIES["gpu_utilization"]
    assert "DCGM_FI_DEV_GPU_UTIL * on (namespace, pod) group_left" in query
    assert query.endswith("/ 100")


def test_one_combined_query_tags_every_signal() -> None:
    combined = combined_query(QUERIES)
    assert combined.count("label_replace(") == len(QUERIES) == 16
    assert combined.count("\nor\n") == len(QUERIES) - 1
    assert (
        "label_replace(sum by (namespace, llmfleet_dev_service, llmfleet_dev_pool) (rate("
        in combined
    )
    assert '"llmfleet_signal", "request_rate", "", "")' in combined


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"rate_window": "1 minute"}, id="rate-window-words"),
        pytest.param({"mean_window": ""}, id="empty-mean-window"),
        pytest.param({"quantile": 1.0}, id="quantile-1"),
        pytest.param({"peak_step": "5"}, id="peak-step-no-unit"),
    ],
)
def test_bad_options_are_refused(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(options))):
        QueryOptions(**options)


def sample(pool: str, signal: str, value: str, service: str = "chat") -> dict[str, Any]:
    labels = {"namespace": "ns", "llmfleet_dev_service": service, "llmfleet_dev_pool": pool}
    return {"metric": {**labels, "llmfleet_signal": signal}, "value": [1.8e9, value]}


T = 1_800_000_000.5
AT = datetime.fromtimestamp(T, tz=UTC)


@pytest.mark.parametrize(
    ("samples", "expected"),
    [
        pytest.param([], {}, id="nothing-scraped"),
        pytest.param([sample("decode", "request_rate", "3")], {}, id="no-gauge-no-pool"),
        pytest.param(
            [sample("decode", "observed_at", str(T))],
            {"decode": PoolSignals(AT, 0.0, 0.0, 0.0, 0.0)},
            id="fresh-engine-counted-nothing-yet",
        ),
        pytest.param(
            [
                sample("decode", "observed_at", str(T)),
                sample("decode", "request_rate", "2.5"),
                sample("decode", "prompt_tokens_rate", "250"),
                sample("decode", "mean_prompt_tokens", "100"),
                sample("decode", "mean_output_tokens", "NaN"),
                sample("decode", "running", "4"),
                sample("decode", "waiting", "1"),
                sample("decode", "kv_cache_usage", "0.25"),
                sample("decode", "preemption_rate", "0"),
                sample("decode", "gpu_utilization", "0.7"),
                sample("decode", "peak_prompt_tokens_rate", "900"),
            ],
            {
                "decode": PoolSignals(
                    AT, 2.5, 250.0, 100.0, 0.0, 4.0, 1.0, 0.25, None, None, 0.0, 0.7, 900.0
                )
            },
            id="every-signal-nan-mean-is-0-nan-quantile-none",
        ),
        pytest.param(
            [sample("decode", "observed_at", str(T)), sample("prefill", "observed_at", str(T))],
            {"decode": PoolSignals(AT, 0, 0, 0, 0), "prefill": PoolSignals(AT, 0, 0, 0, 0)},
            id="two-pools",
        ),
    ],
)
def test_parse(samples: list[dict[str, Any]], expected: dict[str, PoolSignals]) -> None:
    assert parse(samples) == {
        PoolKey("ns", "chat", pool): value for pool, value in expected.items()
    }


def bucket(signal: str, le: str, value: str) -> dict[str, Any]:
    found = sample("decode", signal, value)
    found["metric"]["le"] = le
    return found


def test_parse_builds_histograms_from_buckets_in_any_order() -> None:
    parsed = parse(
        [
            sample("decode", "observed_at", str(T)),
            bucket("ttft_buckets", "+Inf", "10"),
            bucket("ttft_buckets", "0.1", "4"),
            bucket("ttft_buckets", "2.5", "9.5"),
            bucket("itl_request_buckets", "0.025", "3"),
            # An answer cut short of the +Inf bucket cannot say how many requests there were.
            bucket("itl_request_buckets", "0.05", "3"),
            bucket("prefill_buckets", "+Inf", "10"),
            bucket("prefill_buckets", "2.5", "8"),
        ]
    )[PoolKey("ns", "chat", "decode")]
    assert parsed.ttft_histogram == LatencyHistogram((0.1, 2.5, math.inf), (4.0, 9.5, 10.0))
    assert parsed.itl_histogram is None
    assert parsed.prefill_histogram == LatencyHistogram((2.5, math.inf), (8.0, 10.0))
    assert parsed.invalid() == ""


TTFT = [("0.1", "4"), ("2.5", "9.5"), ("+Inf", "10")]
"""p95: rank 9.5 falls at the top of (0.1, 2.5]: 2.5 s."""
PER_REQUEST = [("0.05", "8"), ("+Inf", "10")]
"""p95: rank 9.5 in +Inf: the highest finite bound, 0.05 s."""
GAPS = [("0.01", "0"), ("0.02", "100"), ("+Inf", "100")]
"""p95: rank 95 in (0.01, 0.02]: 0.0195 s."""


@pytest.mark.parametrize(
    ("histograms", "ttft_ms", "itl_ms", "itl_histogram"),
    [
        pytest.param({}, None, None, None, id="none"),
        pytest.param({"ttft_buckets": TTFT}, 2500.0, None, None, id="ttft"),
        pytest.param(
            {"ttft_buckets": [(le, "0") for le, _ in TTFT]}, None, None, None, id="no-request"
        ),
        pytest.param(
            {"itl_request_buckets": PER_REQUEST, "itl_gap_buckets": GAPS}, None, 19.5,
            PER_REQUEST, id="per-request-histogram-gap-quantile",
        ),
        pytest.param({"itl_gap_buckets": GAPS}, None, 19.5, GAPS, id="gaps-only"),
        pytest.param(
            {"itl_gap_buckets": GAPS, "tpot_buckets": PER_REQUEST}, None, 19.5, GAPS,
            id="the-new-name-before-the-old",
        ),
        pytest.param({"tpot_buckets": GAPS}, None, 19.5, GAPS, id="old-name-only"),
        pytest.param(
            {"itl_request_buckets": [("0.05", "8")], "itl_gap_buckets": GAPS}, None, 19.5, None,
            id="a-preferred-histogram-cut-short-is-none-never-mixed",
        ),
    ],
)  # fmt: skip
def test_parse_takes_the_quantiles_and_the_itl_histogram_from_the_buckets(
    histograms: dict[str, list[tuple[str, str]]],
    ttft_ms: float | None,
    itl_ms: float | None,
    itl_histogram: list[tuple[str, str]] | None,
) -> None:
    samples = [sample("decode", "observed_at", str(T))]
    for signal, buckets in histograms.items():
        samples += [bucket(signal, le, value) for le, value in buckets]
    parsed = parse(samples, quantile=0.95)[PoolKey("ns", "chat", "decode")]
    assert parsed.ttft_p95_ms == (None if ttft_ms is None else pytest.approx(ttft_ms))
    assert parsed.itl_p95_ms == (None if itl_ms is None else pytest.approx(itl_ms))
    expected = None
    if itl_histogram is not None:
        bounds = tuple(float(le) for le, _ in itl_histogram)
        expected = LatencyHistogram(bounds, tuple(float(v) for _, v in itl_histogram))
    assert parsed.itl_histogram == expected


def test_parse_keeps_services_apart() -> None:
    parsed = parse([sample("unified", "observed_at", str(T), service=name) for name in "ab"])
    assert sorted(parsed) == [PoolKey("ns", "a", "unified"), PoolKey("ns", "b", "unified")]
    assert not math.isnan(parsed[PoolKey("ns", "a", "unified")].request_rate)


def test_an_unreachable_prometheus_is_one_short_cause() -> None:
    # A closed port on 127.0.0.1: the reason the autoscaler writes quotes this message, so it
    # is the OS error, not urllib3's wrapping with the URL-encoded query.
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(SignalsUnavailable) as raised:
        PrometheusSignals(url, timeout_s=2).read_all()
    assert str(raised.value) == f"Prometheus at {url}: [Errno 111] Connection refused"


class _Stub(BaseHTTPRequestHandler):
    """A Prometheus that answers each service a query selects by name with a fresh pool, and
    a query that selects `broken` with an error."""

    services: ClassVar[list[str]] = []
    queries: ClassVar[list[str]] = []

    def do_GET(self) -> None:  # /api/v1/rules: no recording rules, so raw passes
        self.send_response(404)
        self.end_headers()

    def do_POST(self) -> None:
        query = posted_query(self)
        type(self).queries.append(query)
        named = re.search(r'llmfleet_dev_service=~"([^"]*)"', query)
        selected = named.group(1).split("|") if named else self.services
        if "broken" in selected:
            self.send_response(503)
            self.end_headers()
            return
        result = [sample("unified", "observed_at", str(T), service=name) for name in selected]
        body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def stub() -> Iterator[str]:
    with served(_Stub) as url:
        yield url


@pytest.mark.parametrize(
    ("services", "size", "queries", "failed"),
    [
        pytest.param(["a", "b", "c"], 3, 1, [], id="one-query"),
        pytest.param(["a", "b", "c", "d", "e"], 2, 3, [], id="three-chunks"),
        pytest.param(["a", "b", "broken", "d", "e"], 2, 3, ["broken", "d"], id="a-chunk-fails"),
    ],
)
def test_read_services_reads_in_chunks_and_a_failed_chunk_fails_its_services_alone(
    stub: str, services: list[str], size: int, queries: int, failed: list[str]
) -> None:
    _Stub.services, _Stub.queries = services, []
    signals = PrometheusSignals(stub, chunk_services=size, concurrency=2)
    try:
        read = signals.read_services({("ns", name): ["unified"] for name in services})
    finally:
        signals.close()
    assert len(_Stub.queries) == queries
    assert sorted(read) == [("ns", name) for name in sorted(services)]
    for (_, name), found in read.items():
        if name in failed:
            assert isinstance(found, SignalsUnavailable)
            assert "503" in str(found)
        else:
            assert found == {"unified": PoolSignals(AT, 0.0, 0.0, 0.0, 0.0)}


def test_read_services_raises_when_every_chunk_fails(stub: str) -> None:
    _Stub.services, _Stub.queries = ["broken"], []
    signals = PrometheusSignals(stub, chunk_services=1)
    try:
        with pytest.raises(SignalsUnavailable, match="503"):
            signals.read_services({("ns", "broken"): ["unified"]})
    finally:
        signals.close()


def test_the_fast_read_gives_each_service_its_own_pools_of_one_answer(stub: str) -> None:
    _Stub.services, _Stub.queries = ["a", "b", "stray"], []
    signals = PrometheusSignals(stub)
    try:
        read = signals.read_services_gauges(
            {("ns", "a"): ["unified"], ("ns", "b"): ["decode"], ("other", "a"): ["unified"],
             ("ns", "c"): ["unified"]}
        )  # fmt: skip
    finally:
        signals.close()
    assert len(_Stub.queries) == 1
    assert read == {
        ("ns", "a"): {"unified": PoolSignals(AT, 0.0, 0.0, 0.0, 0.0)},
        ("ns", "b"): {},  # its series are of a pool it does not have
        ("other", "a"): {},  # the same name in another namespace
        ("ns", "c"): {},  # no series
    }
