"""The full pass's PromQL (pure): the label contract, the options, the matchers and chunks of a
pass, and one expression per signal. `signals.py` documents what each signal means and reads
them; `recorded.py` records the same expressions as Prometheus recording rules."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

NAMESPACE_LABEL = "namespace"
SERVICE_LABEL = "llmfleet_dev_service"
"""`llmfleet.dev/service` as Prometheus spells a pod target label."""
POOL_LABEL = "llmfleet_dev_pool"
SIGNAL_LABEL = "llmfleet_signal"
"""Added to each signal's result to tell them apart in the combined answer."""

_BY = f"{NAMESPACE_LABEL}, {SERVICE_LABEL}, {POOL_LABEL}"
HISTOGRAMS = {
    "ttft_buckets": "vllm:time_to_first_token_seconds",
    "prefill_buckets": "vllm:request_prefill_time_seconds",
    "itl_request_buckets": "vllm:request_time_per_output_token_seconds",
    "itl_gap_buckets": "vllm:inter_token_latency_seconds",
    "tpot_buckets": "vllm:time_per_output_token_seconds",
}
"""Signals whose samples are buckets (one per `le`) -> the histogram they read."""

_DURATION = re.compile(r"([0-9]+(ms|s|m|h|d|w|y))+")


@dataclass(frozen=True)
class QueryOptions:
    rate_window: str = "1m"
    """Range of the rates and latency quantiles: at least 4 scrape intervals."""
    mean_window: str = "5m"
    """Range of the mean request sizes."""
    quantile: float = 0.95
    peak_window: str = "30s"
    """Range of the short rate whose highest value inside `rate_window` is the peak: at least two
    scrape intervals (the default suits 15 s scrapes)."""
    peak_step: str = "15s"
    """Resolution the peak is searched at: the scrape interval."""

    def __post_init__(self) -> None:
        for name in ("rate_window", "mean_window", "peak_window", "peak_step"):
            if not _DURATION.fullmatch(getattr(self, name)):
                raise ValueError(
                    f"{name} must be a Prometheus duration such as 1m or 30s, "
                    f"got {getattr(self, name)!r}"
                )
        if not 0 < self.quantile < 1:
            raise ValueError(f"quantile must be between 0 and 1, got {self.quantile}")


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


_RE2_SPECIAL = re.compile(r"([\\.+*?()|\[\]{}^$])")


def _literal(value: str) -> str:
    """`value` as an RE2 pattern that matches it alone (Prometheus anchors every regex)."""
    return _RE2_SPECIAL.sub(r"\\\1", value)


def matchers(
    namespace: str | None = None,
    service: str | None = None,
    services: Sequence[str] | None = None,
) -> str:
    """The label matchers every engine series is selected with (pure): of one namespace, one
    service, and/or any of `services` (one regex of their names)."""
    parts = [f'{SERVICE_LABEL}!=""']
    if namespace is not None:
        parts.append(f"{NAMESPACE_LABEL}={_quote(namespace)}")
    if service is not None:
        parts.append(f"{SERVICE_LABEL}={_quote(service)}")
    if services is not None:
        parts.append(f"{SERVICE_LABEL}=~{_quote('|'.join(_literal(s) for s in services))}")
    return ",".join(parts)


ServiceKey = tuple[str, str]
"""(namespace, name) of an InferenceService."""


@dataclass(frozen=True)
class Chunk:
    """One query of a full pass: the series `match` selects, and the services it answers for."""

    match: str
    services: tuple[ServiceKey, ...]


def chunks(wanted: Iterable[ServiceKey], size: int) -> list[Chunk]:
    """The full pass's queries for `wanted`, each for at most `size` services (pure).

    Up to `size` services in all: one query, of their namespace when they share one, else of
    every namespace (a name matcher would only add work). More: per namespace, in name order,
    runs of `size` services, each selected by one regex of its names; a namespace that fits in
    one run is selected by its namespace alone. A query reads every pool of the services it
    selects, so the split bounds each query's series (and its time, against the client's
    timeout) by the services in it, not by the fleet."""
    if size < 1:
        raise ValueError(f"size must be at least 1, got {size}")
    keys = sorted(set(wanted))
    if len(keys) <= size:
        namespaces = {namespace for namespace, _ in keys}
        one = namespaces.pop() if len(namespaces) == 1 else None
        return [Chunk(matchers(one), tuple(keys))] if keys else []
    found: list[Chunk] = []
    for namespace in sorted({namespace for namespace, _ in keys}):
        mine = [key for key in keys if key[0] == namespace]
        if len(mine) <= size:
            found.append(Chunk(matchers(namespace), tuple(mine)))
            continue
        for start in range(0, len(mine), size):
            run = mine[start : start + size]
            names = [name for _, name in run]
            found.append(Chunk(matchers(namespace, services=names), tuple(run)))
    return found


def signal_queries(options: QueryOptions, match: str) -> dict[str, str]:
    """One PromQL expression per signal, each aggregated by (namespace, service, pool) (pure)."""
    w, mw, step = options.rate_window, options.mean_window, options.peak_step

    def rate(metric: str) -> str:
        return f"sum by ({_BY}) (rate({metric}{{{match}}}[{w}]))"

    def mean(histogram: str) -> str:
        return (
            f"sum by ({_BY}) (increase({histogram}_sum{{{match}}}[{mw}]))"
            f" / sum by ({_BY}) (increase({histogram}_count{{{match}}}[{mw}]))"
        )

    def buckets(histogram: str) -> str:
        return f"sum by ({_BY}, le) (increase({histogram}_bucket{{{match}}}[{w}]))"

    def per_pod(metric: str) -> str:
        return f"sum by ({_BY}, instance) ({metric}{{{match}}})"

    kv = f"vllm:kv_cache_usage_perc{{{match}}}"
    busy = (
        f"({per_pod('vllm:kv_cache_usage_perc')} > 0)"
        f" or ({per_pod('vllm:num_requests_running')}"
        f" + {per_pod('vllm:num_requests_waiting')} > 0)"
    )
    pod_labels = f"namespace, pod, {SERVICE_LABEL}, {POOL_LABEL}"
    pods = f"max by ({pod_labels}) (vllm:num_requests_running{{{match}}})"
    return {
        "observed_at": f"max by ({_BY}) (timestamp(vllm:num_requests_running{{{match}}}))",
        "request_rate": rate("vllm:request_success_total"),
        "prompt_tokens_rate": rate("vllm:prompt_tokens_total"),
        "peak_prompt_tokens_rate": f"max_over_time(({short_rate(options, match)})[{w}:{step}])",
        "mean_prompt_tokens": mean("vllm:request_prompt_tokens"),
        "mean_output_tokens": mean("vllm:request_generation_tokens"),
        "running": f"sum by ({_BY}) (vllm:num_requests_running{{{match}}})",
        "waiting": f"sum by ({_BY}) (vllm:num_requests_waiting{{{match}}})",
        "kv_cache_usage": (
            f"(sum by ({_BY}) ({kv}) / count by ({_BY}) ({busy})) or (0 * sum by ({_BY}) ({kv}))"
        ),
        "preemption_rate": rate("vllm:num_preemptions_total"),
        **{signal: buckets(histogram) for signal, histogram in HISTOGRAMS.items()},
        "gpu_utilization": (
            f"avg by ({_BY}) (DCGM_FI_DEV_GPU_UTIL * on (namespace, pod)"
            f" group_left ({SERVICE_LABEL}, {POOL_LABEL}) (0 * {pods} + 1)) / 100"
        ),
    }


def short_rate(options: QueryOptions, match: str) -> str:
    """The prompt-token rate over `peak_window` whose highest value inside `rate_window` is
    the peak (pure)."""
    return f"sum by ({_BY}) (rate(vllm:prompt_tokens_total{{{match}}}[{options.peak_window}]))"


GAUGES = ("observed_at", "running", "waiting", "kv_cache_usage")
"""The signals a fast pass reads (`PrometheusSignals.read_gauges`): instant values, no window."""


def gauge_queries(match: str) -> dict[str, str]:
    """The instant gauges of `signal_queries`, for the fast pass (pure)."""
    every = signal_queries(QueryOptions(), match)
    return {name: every[name] for name in GAUGES}


def combined_query(queries: Mapping[str, str]) -> str:
    """All signals in one expression, each result tagged with `llmfleet_signal` (pure)."""
    return "\nor\n".join(
        f'label_replace({query}, "{SIGNAL_LABEL}", "{name}", "", "")'
        for name, query in queries.items()
    )
