"""The gateway's per-pool series (requests by outcome, latency histograms, retries, ejections,
429s, in flight), kept in one list of numbers per pool.

prometheus_client keeps a child object per label set and, in each, a value object and a lock
per histogram bucket: ~120 objects the garbage collector tracks per pool that has served a
request, 120,000 at 1,000 pools. Made by each pool's first request, after the start-up heap is
frozen (`gc_pauses`), they were what the gateway's full collections walked while traffic spread
over a large fleet: 10-25 ms pauses of the event loop (bench/gateway_fleet_scale.py). Here a
pool is a `PoolMetrics` (one object) with one list of floats and a dict of outcome counts that
the collector does not track: two tracked objects per pool.

The exposition has the lines prometheus_client's Counter, Histogram and Gauge give for the same
observations (tests/gateway/test_pool_metrics.py), a family's series in the order their pools
first served, and no `_created` series (the gateway turns them off for all its metrics:
`server.serve`).

The figures change on the event loop only; /metrics reads them from its render thread. As with
prometheus_client, which locks each value and not a family, a read can see a request counted in
one series a moment before another.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

LABELS = ("namespace", "service", "pool", "model", "revision")
"""Labels of every per-pool series; `revision` tells a canary's requests from the stable
revision's (the canary analysis compares them), empty where discovery knows none."""
Labels = tuple[str, str, str, str, str]

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)


@dataclass(frozen=True)
class _Histogram:
    name: str
    help: str
    bounds: tuple[float, ...]
    """Upper bounds, +Inf last."""
    offset: int
    """Where its bucket counts start in a pool's figures; its sum follows them."""

    @property
    def end(self) -> int:
        return self.offset + len(self.bounds) + 1


def _histogram(name: str, help: str, buckets: tuple[float, ...], offset: int) -> _Histogram:
    return _Histogram(name, help, (*(float(b) for b in buckets), float("inf")), offset)


_E2E = _histogram(
    "llmfleet_gateway_request_duration_seconds",
    "From the request's arrival to the last byte of the response.",
    LATENCY_BUCKETS,
    0,
)
_TTFT = _histogram(
    "llmfleet_gateway_time_to_first_token_seconds",
    "Streaming requests: from arrival to the first response chunk.",
    LATENCY_BUCKETS,
    _E2E.end,
)
_ITL = _histogram(
    "llmfleet_gateway_inter_token_latency_seconds",
    "Streaming requests: time between consecutive response chunks.",
    ITL_BUCKETS,
    _TTFT.end,
)
_RETRIES, _EJECTIONS, _REJECTED, _IN_FLIGHT = range(_ITL.end, _ITL.end + 4)
_SIZE = _IN_FLIGHT + 1

_REQUESTS = (
    "llmfleet_gateway_requests",
    "Requests by outcome (ok, client_error, upstream_error, timeout, rejected, unavailable, "
    "stream_error, cancelled).",
)
_COUNTERS = (
    (_RETRIES, "llmfleet_gateway_retries", "Requests retried on another endpoint."),
    (_EJECTIONS, "llmfleet_gateway_ejections", "Endpoints ejected after consecutive failures."),
    (
        _REJECTED,
        "llmfleet_gateway_rejected",
        "Requests answered 429 because the pool had too many in flight.",
    ),
)
_IN_FLIGHT_FAMILY = (
    "llmfleet_gateway_in_flight_requests",
    "Requests in flight through this gateway.",
)


class PoolMetrics:
    """One pool's figures: called on the event loop, rendered by `PoolSeries`."""

    __slots__ = ("_figures", "_outcomes", "labels")

    def __init__(self, labels: Labels) -> None:
        self.labels = labels
        self._figures = [0.0] * _SIZE
        self._outcomes: dict[str, float] = {}

    def count_outcome(self, outcome: str) -> None:
        self._outcomes[outcome] = self._outcomes.get(outcome, 0.0) + 1.0

    def observe_e2e(self, seconds: float) -> None:
        self._observe(_E2E, seconds)

    def observe_ttft(self, seconds: float) -> None:
        self._observe(_TTFT, seconds)

    def observe_itl(self, seconds: float) -> None:
        self._observe(_ITL, seconds)

    def count_retry(self) -> None:
        self._figures[_RETRIES] += 1.0

    def count_ejection(self) -> None:
        self._figures[_EJECTIONS] += 1.0

    def count_rejected(self) -> None:
        self._figures[_REJECTED] += 1.0

    def add_in_flight(self, change: int) -> None:
        self._figures[_IN_FLIGHT] += change

    def _observe(self, histogram: _Histogram, value: float) -> None:
        figures = self._figures
        # the first bucket whose upper bound is >= value, as prometheus_client counts it
        figures[histogram.offset + bisect_left(histogram.bounds, value)] += 1.0
        figures[histogram.end - 1] += value


Pause = Callable[[], None]


class PoolSeries:
    """A registry collector of every pool's series; pools appear with their first request."""

    def __init__(self) -> None:
        self._pools: dict[Labels, PoolMetrics] = {}

    def pool(self, labels: Labels) -> PoolMetrics:
        found = self._pools.get(labels)
        if found is None:
            found = self._pools[labels] = PoolMetrics(labels)
        return found

    def describe(self) -> list[Metric]:
        return list(self._families([], lambda: None, 1))

    def collect(self) -> Iterator[Metric]:
        return self._families(list(self._pools.values()), lambda: None, 1 << 30)

    def collect_paced(self, pause_if_due: Pause, every: int) -> Iterator[Metric]:
        """`collect()`, with `pause_if_due()` called after every `every` pools' samples of a
        family are made (at 1,000 pools a histogram family is 18,000 samples)."""
        return self._families(list(self._pools.values()), pause_if_due, every)

    def _families(
        self, pools: list[PoolMetrics], pause_if_due: Pause, every: int
    ) -> Iterator[Metric]:
        # The families, in order and sample for sample, that prometheus_client's metrics
        # registered in this order would give (a family's series ordered by pool).
        def paced() -> Iterator[PoolMetrics]:
            for index, pool in enumerate(pools):
                yield pool
                if index % every == every - 1:
                    pause_if_due()

        requests = CounterMetricFamily(*_REQUESTS, labels=(*LABELS, "outcome"))
        for pool in paced():
            for outcome, count in list(pool._outcomes.items()):
                requests.add_metric((*pool.labels, outcome), count)
        yield requests
        for histogram in (_E2E, _TTFT, _ITL):
            yield _histogram_family(histogram, paced())
        for position, name, help in _COUNTERS:
            counter = CounterMetricFamily(name, help, labels=LABELS)
            for pool in paced():
                counter.add_metric(pool.labels, pool._figures[position])
            yield counter
        in_flight = GaugeMetricFamily(*_IN_FLIGHT_FAMILY, labels=LABELS)
        for pool in paced():
            in_flight.add_metric(pool.labels, pool._figures[_IN_FLIGHT])
        yield in_flight


_LE: dict[float, str] = {
    bound: floatToGoString(bound)  # type: ignore[no-untyped-call]
    for bucket in (LATENCY_BUCKETS, ITL_BUCKETS)
    for bound in (*bucket, float("inf"))
}
"""The `le` label of each bucket bound, as prometheus_client writes it."""


def _histogram_family(histogram: _Histogram, pools: Iterator[PoolMetrics]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(histogram.name, histogram.help, labels=LABELS)
    les = [_LE[bound] for bound in histogram.bounds]
    start, end = histogram.offset, histogram.end - 1
    for pool in pools:
        figures = pool._figures
        cumulative, buckets = 0.0, []
        for le, count in zip(les, figures[start:end], strict=True):
            cumulative += count
            buckets.append((le, cumulative))
        family.add_metric(pool.labels, buckets, figures[end])
    return family
