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
`server.serve`). /metrics writes it straight from the figures (`PoolSeries.text`, the bytes
`generate_latest` makes of `collect()`), a twelfth of the CPU.

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

    __slots__ = ("_figures", "_head", "_outcomes", "_tail", "labels")

    def __init__(self, labels: Labels) -> None:
        self.labels = labels
        self._figures = [0.0] * _SIZE
        self._outcomes: dict[str, float] = {}
        # its labels as the text format writes them (sorted by name): model and namespace,
        # then pool, revision and service, with `outcome` or nothing between (`PoolSeries.text`)
        namespace, service, pool, model, revision = (_escaped(value) for value in labels)
        self._head = f'model="{model}",namespace="{namespace}"'
        self._tail = f'pool="{pool}",revision="{revision}",service="{service}"'

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
    """A registry collector of every pool's series; pools appear with their first request,
    all their series at once and at zero: a histogram that appeared only with its first
    observation would lose that observation to Prometheus's `rate()`, which needs a sample
    before the increase (`llmfleet status` showed no TTFT after a first streamed load)."""

    def __init__(self) -> None:
        self._pools: dict[Labels, PoolMetrics] = {}

    def pool(self, labels: Labels) -> PoolMetrics:
        found = self._pools.get(labels)
        if found is None:
            found = self._pools[labels] = PoolMetrics(labels)
        return found

    def forget(self, gone: Callable[[Labels], bool]) -> int:
        """Drop every pool whose labels are `gone` and that has no request in flight; returns
        how many (a request in flight keeps its pool until a later call)."""
        dropped = [labels for labels, pool in self._pools.items()
                   if gone(labels) and pool._figures[_IN_FLIGHT] == 0]  # fmt: skip
        for labels in dropped:
            del self._pools[labels]
        return len(dropped)

    def describe(self) -> list[Metric]:
        return list(self._families([]))

    def collect(self) -> Iterator[Metric]:
        return self._families(list(self._pools.values()))

    def text(self, pause_if_due: Pause, every: int) -> bytes:
        """`generate_latest` of this collector, byte for byte (`pieces`, joined)."""
        return b"".join(self.pieces(pause_if_due, every))

    def pieces(self, pause_if_due: Pause, every: int) -> list[bytes]:
        """`text` in pieces, written straight from the figures, with `pause_if_due()` after
        every `every` pools of a family: at 1,000 pools the families are ~56,000 lines, ~380 ms
        of CPU through prometheus_client's samples (a named tuple and a labels dict per line,
        each label escaped, sorted and joined), a fraction of that here, where each pool's
        label text is made once. Each piece is joined and encoded before its pause: the lines
        of a whole render joined and encoded at once were two calls of 3 and 3 ms at 1,000
        pools (7.7 MB), held without a break for the event loop (bench/_stall_probe.py caught
        the render thread there during the loop's stalls). A /metrics render pauses the
        garbage collector (`core.gc_paused`), and what requests leave in cycles
        meanwhile is collected in one go after it: the shorter the render, the shorter that
        collection."""
        pools = list(self._pools.values())
        out: list[str] = []
        done: list[bytes] = []

        def flush() -> None:
            done.append("".join(out).encode())
            out.clear()

        def paced() -> Iterator[PoolMetrics]:
            for index, pool in enumerate(pools):
                yield pool
                if index % every == every - 1:
                    flush()
                    pause_if_due()

        name = _REQUESTS[0] + "_total"
        out.append(_header(name, _REQUESTS[1], "counter"))
        for pool in paced():
            for outcome, times in list(pool._outcomes.items()):
                out.append(f'{name}{{{pool._head},outcome="{_escaped(outcome)}",{pool._tail}}} '
                           f"{_go(times)}\n")  # fmt: skip
        for histogram in (_E2E, _TTFT, _ITL):
            out.append(_header(histogram.name, histogram.help, "histogram"))
            bucket, count, total = (
                histogram.name + suffix for suffix in ("_bucket", "_count", "_sum")
            )
            les = [_LE[bound] for bound in histogram.bounds]
            start, end = histogram.offset, histogram.end - 1
            for pool in paced():
                figures = pool._figures
                labels = f"{pool._head},{pool._tail}"
                cumulative = 0.0
                for le, value in zip(les, figures[start:end], strict=True):
                    cumulative += value
                    out.append(f'{bucket}{{le="{le}",{labels}}} {_go(cumulative)}\n')
                out.append(f"{count}{{{labels}}} {_go(cumulative)}\n")
                out.append(f"{total}{{{labels}}} {_go(figures[end])}\n")
        for position, counter, help in _COUNTERS:
            name = counter + "_total"
            out.append(_header(name, help, "counter"))
            for pool in paced():
                out.append(f"{name}{{{pool._head},{pool._tail}}} {_go(pool._figures[position])}\n")
        name = _IN_FLIGHT_FAMILY[0]
        out.append(_header(name, _IN_FLIGHT_FAMILY[1], "gauge"))
        for pool in paced():
            out.append(f"{name}{{{pool._head},{pool._tail}}} {_go(pool._figures[_IN_FLIGHT])}\n")
        flush()
        return done

    def _families(self, pools: list[PoolMetrics]) -> Iterator[Metric]:
        # The families, in order and sample for sample, that prometheus_client's metrics
        # registered in this order would give (a family's series ordered by pool). Unpaced:
        # the paced /metrics goes through `text`.
        requests = CounterMetricFamily(*_REQUESTS, labels=(*LABELS, "outcome"))
        for pool in pools:
            for outcome, count in list(pool._outcomes.items()):
                requests.add_metric((*pool.labels, outcome), count)
        yield requests
        for histogram in (_E2E, _TTFT, _ITL):
            yield _histogram_family(histogram, pools)
        for position, name, help in _COUNTERS:
            counter = CounterMetricFamily(name, help, labels=LABELS)
            for pool in pools:
                counter.add_metric(pool.labels, pool._figures[position])
            yield counter
        in_flight = GaugeMetricFamily(*_IN_FLIGHT_FAMILY, labels=LABELS)
        for pool in pools:
            in_flight.add_metric(pool.labels, pool._figures[_IN_FLIGHT])
        yield in_flight


def _escaped(value: str) -> str:
    """A label value as the text format writes it (prometheus_client's escaping)."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _header(name: str, help: str, kind: str) -> str:
    help = help.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {help}\n# TYPE {name} {kind}\n"


def _go(value: float) -> str:
    """A sample's value as the text format writes it (`floatToGoString`), counts quickly."""
    if value.is_integer() and abs(value) < 1e6:  # where repr() has no exponent
        return f"{value:.1f}"
    return floatToGoString(value)  # type: ignore[no-untyped-call,no-any-return]


_LE: dict[float, str] = {
    bound: floatToGoString(bound)  # type: ignore[no-untyped-call]
    for bucket in (LATENCY_BUCKETS, ITL_BUCKETS)
    for bound in (*bucket, float("inf"))
}
"""The `le` label of each bucket bound, as prometheus_client writes it."""


def _histogram_family(histogram: _Histogram, pools: list[PoolMetrics]) -> HistogramMetricFamily:
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
