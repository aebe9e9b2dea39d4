"""bench/_fleet_metrics.py: the one exporter that stands in for every benchmark pod's engine
serves text Prometheus parses, labelled as the autoscaler's query selects and groups it."""

from __future__ import annotations

import re

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from llmfleet.autoscaler.signals import (
    NAMESPACE_LABEL,
    POOL_LABEL,
    SERVICE_LABEL,
    QueryOptions,
    matchers,
    signal_queries,
)
from tests.unit.bench_modules import load

fleet = load("_fleet_metrics")
PODS = [
    fleet.Pod("ns-a", "svc-0000-unified-abc", "svc-0000", "unified", "10.0.0.1"),
    fleet.Pod("ns-a", "svc-0000-unified-def", "svc-0000", "unified", "10.0.0.2"),
    fleet.Pod("ns-b", "svc-0001-prefill-xyz", "svc-0001", "prefill", "10.0.1.7"),
]
QUERY_NAMES = set(
    re.findall(r"vllm:[a-z_]+", " ".join(signal_queries(QueryOptions(), matchers()).values()))
)
"""Every vLLM series name the autoscaler's full pass reads (its fallbacks included)."""


def samples(t: float) -> list[Sample]:
    text = fleet.exposition(PODS, t)
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def by_pod(found: list[Sample], name: str) -> dict[str, float]:
    return {s.labels["pod"]: s.value for s in found if s.name == name and "le" not in s.labels}


def test_every_sample_carries_the_labels_the_query_groups_by() -> None:
    expected = {
        pod.pod: {
            NAMESPACE_LABEL: pod.namespace,
            SERVICE_LABEL: pod.service,
            POOL_LABEL: pod.pool,
            "pod": pod.pod,
            "instance": f"{pod.ip}:{fleet.ENGINE_PORT}",
        }
        for pod in PODS
    }
    found = samples(100.0)
    assert found
    for sample in found:
        labels = {k: v for k, v in sample.labels.items() if k != "le"}
        assert labels == expected[labels["pod"]], sample


def test_serves_only_what_the_query_reads_and_every_primary_family() -> None:
    names = {s.name for s in samples(100.0)}
    assert names <= QUERY_NAMES
    served = {re.sub(r"_(bucket|sum|count)$", "", name) for name in names}
    primary = {
        "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
        "vllm:request_success_total", "vllm:prompt_tokens_total", "vllm:num_preemptions_total",
        "vllm:request_prompt_tokens", "vllm:request_generation_tokens",
        "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
        "vllm:request_prefill_time_seconds",
    }  # fmt: skip
    assert primary <= served
    read = {re.sub(r"_(bucket|sum|count)$", "", name) for name in QUERY_NAMES}
    assert primary <= read  # the query still reads them all


@pytest.mark.parametrize(
    "name",
    [
        "vllm:request_success_total",
        "vllm:prompt_tokens_total",
        "vllm:num_preemptions_total",
        "vllm:request_prompt_tokens_count",
        "vllm:request_generation_tokens_sum",
    ],
)
def test_counters_grow_every_scrape_interval(name: str) -> None:
    """Rates over a 15 s scrape are non-zero for every pod, so the query does real work."""
    earlier, later = by_pod(samples(100.0), name), by_pod(samples(115.0), name)
    assert set(earlier) == {pod.pod for pod in PODS}
    for pod, value in earlier.items():
        assert later[pod] > value, pod


@pytest.mark.parametrize("histogram", sorted(fleet.BOUNDS))
def test_buckets_are_cumulative_and_grow(histogram: str) -> None:
    found, later = samples(300.0), samples(315.0)
    for pod in PODS:
        buckets = sorted(
            (float(s.labels["le"]), s.value)
            for s in found
            if s.name == f"{histogram}_bucket" and s.labels["pod"] == pod.pod
        )
        values = [value for _, value in buckets]
        assert values == sorted(values)
        assert values[-1] > 0
        assert buckets[-1][0] == float("inf")
        total = [s.value for s in later if s.name == f"{histogram}_bucket"
                 and s.labels["pod"] == pod.pod and s.labels["le"] == "+Inf"]  # fmt: skip
        assert total[0] > values[-1]
