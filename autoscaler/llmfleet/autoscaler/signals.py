"""Every pool's `PoolSignals` from Prometheus (DESIGN.md §7), in one PromQL query per chunk of
services (one query per pass up to `chunk_services` services).

Label contract. The engines' series carry `namespace`, `llmfleet_dev_service` and
`llmfleet_dev_pool`: the ServiceMonitor's `podTargetLabels` (`llmfleet.dev/service`,
`llmfleet.dev/pool`) become those, and the local cluster's file-based discovery sets the same.
Metric names are vLLM's (llm-d-inference-sim exports the same names).

One query, one HTTP call. Each signal is one PromQL expression aggregated by
(namespace, service, pool); `label_replace` tags its result with `llmfleet_signal="<field>"` and
`or` joins them all, so one `/api/v1/query` returns every signal of every pool of every service
(or of one namespace / service / chunk of services), all evaluated at the same instant. The
query goes in a form-encoded POST body, never in the URL (`llmfleet.core.prometheus_http`): a
chunk's regex of 100 service names in every signal makes ~30 KB of query, and proxies in front
of Prometheus commonly answer 414 to a request line over 8 KB.

Chunks. Prometheus evaluates one query on one core, in time about proportional to the series it
selects (~29 per engine pod), so at 1,000 services x 10 pods one query of the whole fleet took
4-7 s on 2 cores and ran into the 5 s timeout. A full pass of more than `chunk_services`
services (100) asks `chunks()`: per namespace, runs of that many services selected by a regex
of their names, `concurrency` (2) at once, each with its own `timeout_s`; a chunk that fails
holds only its services' pools. Measured: `bench/autoscaler_query_scale.py`,
`bench/results/issue28-autoscaler-query-scale.txt`. The chunks of one pass are evaluated at
slightly different instants (within the pass), which no decision compares across services.

Recorded series. Where Prometheus evaluates recording rules of exactly these expressions with
this reader's windows (the chart's group `llmfleet.pools`), the full pass reads the pools'
recorded series instead, the same signals with the same meaning as of the rules' last
evaluation (`recorded.py`; `PrometheusSignals` says when and what each read costs).

Meaning of each field, and what absence means (`PoolSignals` documents units):
- a pool is present when its engines' `vllm:num_requests_running` gauge is; otherwise it is
  absent from the result and the policy holds it (fail-static);
- `observed_at`: the newest sample's own timestamp (`timestamp()`), not the query time, so a
  Prometheus that stopped scraping shows up as stale;
- `request_rate`, `prompt_tokens_rate`: `rate()` of `vllm:request_success_total` (requests that
  finished, every finish reason) and `vllm:prompt_tokens_total` over `rate_window`. A present pool
  without these counters has counted nothing yet (the simulator creates them on its first
  request): 0;
- `peak_prompt_tokens_rate`: the highest `rate(vllm:prompt_tokens_total[peak_window])` inside
  `rate_window`, by a subquery at `peak_step`: bursts of seconds that the window's mean hides;
  None before the counter exists;
- `mean_prompt_tokens`, `mean_output_tokens`: sum / count of the per-request histograms
  `vllm:request_prompt_tokens` and `vllm:request_generation_tokens` over `mean_window` (request
  sizes drift slowly, so a longer window than the rates'); 0 when no request finished in it;
- `running`, `waiting`: sums of the gauges over the pool's pods;
- `kv_cache_usage`: mean of `vllm:kv_cache_usage_perc` over the pool's *busy* pods (KV cache in
  use or a request running or waiting). NOTE: warm spares are scraped too (the headless metrics
  Service covers them) and Prometheus cannot tell them from serving pods, because `podTargetLabels`
  does not carry `llmfleet.dev/serving`. A spare holds no KV cache and no request, so it drops out
  here instead of diluting the mean that the policy multiplies by its ready *serving* pods. An idle
  serving pod drops out as well, which errs towards more replicas and only matters while the
  pool's other pods are busy. 0 when no pod is busy; None when the gauge is not exported;
- `ttft_p95_ms`, `itl_p95_ms`: PromQL's `histogram_quantile`, computed by `parse`
  (`LatencyHistogram.quantile`) from the pool's summed bucket increases the histograms below
  read anyway (asking Prometheus for it read every bucket series twice), of
  `vllm:time_to_first_token_seconds` and the token gaps `vllm:inter_token_latency_seconds`
  (falling back to `vllm:time_per_output_token_seconds`, vLLM's name before 0.10), in ms. The
  quantile is interpolated inside a bucket: its resolution is the bucket's width. None when no
  request was measured within `rate_window` (PromQL's NaN);
- `ttft_histogram`, `itl_histogram`: the goodput's raw material, each bucket's `increase()` over
  `rate_window` summed by `le` over the pool's pods (the combined answer carries `le`; `parse`
  builds a `goodput.LatencyHistogram`, and the policy takes the share over the service's own
  target from it, so one query serves every SLO). TTFT from `vllm:time_to_first_token_seconds`.
  ITL per request from `vllm:request_time_per_output_token_seconds` (each request's mean gap, the
  figure the SLO's ITL attainment is over); an engine without it (llm-d-inference-sim, vLLM
  before 0.9) falls back to the token-gap histograms `vllm:inter_token_latency_seconds` or
  `vllm:time_per_output_token_seconds`, where the share is of token gaps, not requests. Each
  histogram is its own signal (one read of its bucket series); `parse` takes a fallback only for
  the pools the preferred one has no buckets for, so bucket bounds of two histograms never mix.
  None when no series exists;
- `prefill_histogram`: requests by the time their prefill phase took
  (`vllm:request_prefill_time_seconds`, from first scheduled to first token), the same way: the
  misses a prompt's own length causes, which more replicas would not remove (`goodput.py`,
  `capacity_misses`). vLLM observes it when the request finishes, not at its first token, so it
  may fall in a later window than the request's TTFT. None where the engine does not export it
  (llm-d-inference-sim);
- `preemption_rate`: `rate()` of `vllm:num_preemptions_total`; None when not exported (the
  simulator does not);
- `gpu_utilization`: mean `DCGM_FI_DEV_GPU_UTIL` / 100 over the pool's GPUs, joined on
  (namespace, pod): dcgm-exporter in Kubernetes mode labels each GPU with the pod using it (scrape
  it with `honorLabels: true`), and the engines' series carry `pod` (the Prometheus Operator adds
  it). None without DCGM.

Rate window vs scrape interval: `rate()` needs two samples inside its window, so the window must
span at least two scrapes and should span four, so that one missed scrape never empties it: 1m
for the common 15 s interval (the default), a few seconds in tests that scrape every second. A
longer window smooths more and reacts later; the policy's own averages do the smoothing.

Unreachable Prometheus, an HTTP error or a malformed answer raise `SignalsUnavailable`; the
caller turns that into `signals=None` for every pool with a logged reason.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from llmfleet.autoscaler.goodput import LatencyHistogram
from llmfleet.autoscaler.inputs import PoolSignals
from llmfleet.autoscaler.promql import (
    GAUGES,
    HISTOGRAMS,
    NAMESPACE_LABEL,
    POOL_LABEL,
    SERVICE_LABEL,
    SIGNAL_LABEL,
    Chunk,
    QueryOptions,
    ServiceKey,
    chunks,
    combined_query,
    gauge_queries,
    matchers,
    signal_queries,
)
from llmfleet.autoscaler.recorded import RulesCheck, check_rules, recorded_queries
from llmfleet.core import prometheus_http
from llmfleet.core.loopback import LoopbackGuard

log = logging.getLogger("llmfleet.autoscaler")

__all__ = [
    "GAUGES",
    "HISTOGRAMS",
    "NAMESPACE_LABEL",
    "POOL_LABEL",
    "SERVICE_LABEL",
    "SIGNAL_LABEL",
    "Chunk",
    "PoolKey",
    "PrometheusSignals",
    "QueryOptions",
    "ServiceKey",
    "SignalsUnavailable",
    "chunks",
    "combined_query",
    "gauge_queries",
    "matchers",
    "parse",
    "signal_queries",
]

_ITL_HISTOGRAM = ("itl_request_buckets", "itl_gap_buckets", "tpot_buckets")
"""The ITL histogram's sources, preferred first (module docstring)."""
_ITL_GAPS = ("itl_gap_buckets", "tpot_buckets")
"""The ITL quantile's sources, preferred first: token gaps, vLLM's name since 0.10 first."""


class SignalsUnavailable(Exception):
    """Prometheus could not be asked (unreachable, an HTTP error, a malformed answer)."""


@dataclass(frozen=True, order=True)
class PoolKey:
    namespace: str
    service: str
    pool: str


def _number(value: float | None) -> float | None:
    """None for a missing value or PromQL's NaN (a quantile or mean over no samples)."""
    return None if value is None or math.isnan(value) else value


def parse(
    result: Sequence[Mapping[str, Any]], quantile: float = 0.95
) -> dict[PoolKey, PoolSignals]:
    """PoolSignals per present pool from the combined query's vector result (pure); the TTFT and
    ITL `quantile` from the buckets (`LatencyHistogram.quantile`)."""
    # Keyed by plain tuples while the samples are sorted in (one PoolKey per pool, not per
    # sample: a pool of the full pass has ~30 samples, most of them buckets).
    values: dict[tuple[str, str, str], dict[str, float]] = {}
    buckets: dict[tuple[str, str, str], dict[str, dict[float, float]]] = {}
    for sample in result:
        labels = sample["metric"]
        key = (labels.get(NAMESPACE_LABEL, ""), labels.get(SERVICE_LABEL, ""), labels[POOL_LABEL])
        signal, value = labels[SIGNAL_LABEL], float(sample["value"][1])
        if signal in HISTOGRAMS:
            # float() reads Prometheus' "+Inf" bound.
            buckets.setdefault(key, {}).setdefault(signal, {})[float(labels["le"])] = value
        else:
            values.setdefault(key, {})[signal] = value
    pools: dict[PoolKey, PoolSignals] = {}
    for key, found in sorted(values.items()):
        if "observed_at" not in found:
            continue  # DCGM or stray series without the engines' gauge: not a pool we can size
        histograms = buckets.get(key, {})
        ttft = _histogram(histograms.get("ttft_buckets"))
        gaps = _histogram(_first(histograms, _ITL_GAPS))
        pools[PoolKey(*key)] = PoolSignals(
            observed_at=datetime.fromtimestamp(found["observed_at"], tz=UTC),
            request_rate=found.get("request_rate", 0.0),
            prompt_tokens_rate=found.get("prompt_tokens_rate", 0.0),
            mean_prompt_tokens=_number(found.get("mean_prompt_tokens")) or 0.0,
            mean_output_tokens=_number(found.get("mean_output_tokens")) or 0.0,
            running=found.get("running", 0.0),
            waiting=found.get("waiting", 0.0),
            kv_cache_usage=_number(found.get("kv_cache_usage")),
            ttft_p95_ms=_ms(ttft.quantile(quantile) if ttft else None),
            itl_p95_ms=_ms(gaps.quantile(quantile) if gaps else None),
            preemption_rate=_number(found.get("preemption_rate")),
            gpu_utilization=_number(found.get("gpu_utilization")),
            peak_prompt_tokens_rate=_number(found.get("peak_prompt_tokens_rate")),
            ttft_histogram=ttft,
            itl_histogram=_histogram(_first(histograms, _ITL_HISTOGRAM)),
            prefill_histogram=_histogram(histograms.get("prefill_buckets")),
        )
    return pools


def _first(
    histograms: Mapping[str, Mapping[float, float]], preferred: Sequence[str]
) -> Mapping[float, float] | None:
    """The buckets of the first signal in `preferred` the pool has any of: never two
    histograms' buckets mixed (their bounds may differ)."""
    return next((histograms[s] for s in preferred if histograms.get(s)), None)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _histogram(counts: Mapping[float, float] | None) -> LatencyHistogram | None:
    """The buckets as a histogram; None without them or without the +Inf bucket (a partial
    answer cannot say how many requests there were)."""
    if not counts or math.inf not in counts:
        return None
    bounds = tuple(sorted(counts))
    return LatencyHistogram(bounds, tuple(counts[b] for b in bounds))


_ERRNO = re.compile(r"\[Errno -?\d+\] [^'\")\]]+")
_QUERY = re.compile(r"\?query=\S+")


def _cause(error: Exception) -> str:
    """What went wrong, in a few words: the OS error inside urllib3's wrapping when there is one
    (`[Errno 111] Connection refused`), else the message without the encoded query."""
    text = str(error)
    found = _ERRNO.search(text)
    if found:
        return found.group(0).strip()
    return _QUERY.sub("?query=...", text)


class PrometheusSignals:
    """Reads PoolSignals from the Prometheus at `url`; one HTTP call per `read_all` / `read`.

    No retries inside a call (the next pass is the retry) and a `timeout_s` per call, so an
    unreachable Prometheus costs one pass at most `timeout_s`, never a backoff sequence.

    The full pass (`read_services`) reads one of two sources, chosen per pass (`source`):
    - "recorded" (`recorded_rules="auto"`, when `/api/v1/rules` says Prometheus records every
      series it needs with this reader's own windows, `recorded.check_rules`): the pools'
      recorded series, a few instant selectors per pool. Its cost in the pass is that read
      (about the pools' series, not the pods'); Prometheus pays the evaluation on its rule
      schedule instead. Figures as of the last rule evaluation (`recorded.py` says what that
      changes);
    - "raw" (otherwise, or `recorded_rules="off"`): `signal_queries` over the engines' series,
      evaluated inside the pass: its cost grows with the pods (about 3.5-4 s at 10,000 pods on
      2 cores, `bench/autoscaler_query_scale.py`).
    The rules are asked at the first full pass and then every `rules_check_s` (one small GET);
    an answer that cannot be read means "raw" and is asked again at the next pass. The fast
    pass and `read_all` / `read` always read the raw series.
    """

    def __init__(
        self,
        url: str,
        *,
        rate_window: str = "1m",
        mean_window: str = "5m",
        quantile: float = 0.95,
        peak_window: str = "30s",
        peak_step: str = "15s",
        timeout_s: float = 5.0,
        chunk_services: int = 100,
        concurrency: int = 2,
        guard: LoopbackGuard | None = None,
        recorded_rules: str = "auto",
        rules_check_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if chunk_services < 1 or concurrency < 1:
            raise ValueError(
                f"chunk_services and concurrency must be at least 1, "
                f"got {chunk_services} and {concurrency}"
            )
        if recorded_rules not in ("auto", "off"):
            raise ValueError(f"recorded_rules must be auto or off, got {recorded_rules!r}")
        self.recorded_rules = recorded_rules
        self.rules_check_s = rules_check_s
        self._clock = clock
        self._rules_checked_at: float | None = None
        self.rules = RulesCheck("not asked yet")
        """The last readable `/api/v1/rules` answer's verdict."""
        self._timeout_s = timeout_s
        self.url = url.rstrip("/")
        self.options = QueryOptions(rate_window, mean_window, quantile, peak_window, peak_step)
        self.chunk_services = chunk_services
        self.concurrency = concurrency
        self._guard = guard
        # No redirect with the guard on: one could lead off loopback, past the check.
        self._session = prometheus_http.session(redirects=guard is None or not guard.enabled)

    def read_all(
        self, namespace: str | None = None, service: str | None = None
    ) -> dict[PoolKey, PoolSignals]:
        """Every present pool (of one namespace / service when given), in one HTTP call."""
        return self._query(signal_queries(self.options, matchers(namespace, service)))

    def read_services(
        self, wanted: Mapping[ServiceKey, Sequence[str]]
    ) -> dict[ServiceKey, dict[str, PoolSignals] | SignalsUnavailable]:
        """Signals per pool of every (namespace, service) in `wanted`: the autoscaler's full
        pass. One query per `chunks(wanted, chunk_services)`, `concurrency` at once, each with
        its own `timeout_s`, of the pass's `source()`. A chunk that fails is its services'
        `SignalsUnavailable` (the others' decisions go on); when every chunk fails, raises the
        first one's."""
        plan = chunks(wanted, self.chunk_services)
        queries = recorded_queries if plan and self.source() == "recorded" else signal_queries

        def one(chunk: Chunk) -> dict[PoolKey, PoolSignals] | SignalsUnavailable:
            try:
                return self._query(queries(self.options, chunk.match))
            except SignalsUnavailable as error:
                return error

        if len(plan) <= 1:
            results: list[dict[PoolKey, PoolSignals] | SignalsUnavailable] = [
                one(chunk) for chunk in plan
            ]
        else:
            with ThreadPoolExecutor(min(self.concurrency, len(plan))) as pool:
                results = list(pool.map(one, plan))
        failed = [result for result in results if isinstance(result, SignalsUnavailable)]
        if failed and len(failed) == len(results):
            raise failed[0]
        read: dict[ServiceKey, dict[str, PoolSignals] | SignalsUnavailable] = {}
        for chunk, result in zip(plan, results, strict=True):
            if isinstance(result, Exception):
                read |= dict.fromkeys(chunk.services, result)
            else:
                read |= _by_service(result, {key: wanted[key] for key in chunk.services})
        return read

    def source(self) -> str:
        """What the full pass reads now: "recorded" or "raw" (class docstring). Asks
        `/api/v1/rules` when its last readable answer is `rules_check_s` old, or there is none;
        logs a change of source with its reason."""
        if self.recorded_rules == "off":
            return "raw"
        now = self._clock()
        if self._rules_checked_at is None or now - self._rules_checked_at >= self.rules_check_s:
            before = self.rules
            try:
                self.rules = check_rules(self._rule_groups(), self.options)
                self._rules_checked_at = now
            except SignalsUnavailable as error:
                self.rules = RulesCheck(f"rules unreadable: {error}")
            if self.rules.problem != before.problem:
                if self.rules.problem:
                    log.info("full passes read the engines' raw series: %s", self.rules.problem)
                else:
                    log.info(
                        "full passes read the recorded series (evaluated every %g s)",
                        self.rules.interval_s,
                    )
        return "raw" if self.rules.problem else "recorded"

    def _rule_groups(self) -> list[dict[str, Any]]:
        """`/api/v1/rules?type=record`'s groups."""
        url = f"{self.url}/api/v1/rules"
        try:
            if self._guard is not None:
                self._guard.check_url(self.url, "prometheus")
            response = self._session.get(url, params={"type": "record"}, timeout=self._timeout_s)
            response.raise_for_status()
            groups: list[dict[str, Any]] = response.json()["data"]["groups"]
            return groups
        except (OSError, KeyError, TypeError, ValueError) as error:
            raise SignalsUnavailable(f"Prometheus at {self.url}: {_cause(error)}") from error

    def read_services_gauges(
        self, wanted: Mapping[tuple[str, str], Sequence[str]]
    ) -> dict[tuple[str, str], dict[str, PoolSignals]]:
        """`read_gauges` of every service in `wanted`, in one query: the fast pass."""
        found = self._query(gauge_queries(matchers(_one_namespace(wanted))))
        return _by_service(found, wanted)

    def read(self, namespace: str, service: str, pools: Sequence[str]) -> dict[str, PoolSignals]:
        """Signals per pool of one service (one HTTP call); a pool without series is absent."""
        return _of(self.read_all(namespace, service), namespace, service, pools)

    def read_gauges(
        self, namespace: str, service: str, pools: Sequence[str]
    ) -> dict[str, PoolSignals]:
        """Only the instant gauges per pool (running, waiting, KV-cache usage and their sample
        time), one small query: the fast pass's read. The other fields are zero or None."""
        found = self._query(gauge_queries(matchers(namespace, service)))
        return _of(found, namespace, service, pools)

    def _query(self, queries: Mapping[str, str]) -> dict[PoolKey, PoolSignals]:
        try:
            if self._guard is not None:
                self._guard.check_url(self.url, "prometheus")
            result = prometheus_http.instant_query(
                self._session, self.url, combined_query(queries), self._timeout_s
            )
            return parse(result, self.options.quantile)
        except (OSError, prometheus_http.QueryRefused, KeyError, TypeError, ValueError) as error:
            # OSError covers requests' errors (connection refused, timeout, bad JSON).
            raise SignalsUnavailable(f"Prometheus at {self.url}: {_cause(error)}") from error

    def close(self) -> None:
        self._session.close()


def _one_namespace(wanted: Mapping[tuple[str, str], Sequence[str]]) -> str | None:
    """The namespace all of `wanted` share, or None (then every namespace is asked)."""
    namespaces = {namespace for namespace, _ in wanted}
    return namespaces.pop() if len(namespaces) == 1 else None


def _of(
    found: Mapping[PoolKey, PoolSignals], namespace: str, service: str, pools: Sequence[str]
) -> dict[str, PoolSignals]:
    return _by_service(found, {(namespace, service): pools})[(namespace, service)]


def _by_service(
    found: Mapping[PoolKey, PoolSignals], wanted: Mapping[ServiceKey, Sequence[str]]
) -> dict[ServiceKey, dict[str, PoolSignals]]:
    """Signals per pool of each service in `wanted` (service -> its pools), of the pools in
    `found`; a pool not found is absent. One look at each pool found, not one per service."""
    read: dict[ServiceKey, dict[str, PoolSignals]] = {key: {} for key in wanted}
    for key, signals in found.items():
        service = (key.namespace, key.service)
        pools = wanted.get(service)
        if pools is not None and key.pool in pools:
            read[service][key.pool] = signals
    return read
