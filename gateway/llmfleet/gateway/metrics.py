"""The gateway's Prometheus metrics, in a registry of their own per app (no global state).

Every series carries namespace, service, pool and model, as DESIGN.md §1 asks of all metrics
(and the per-pool ones the revision that served).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics import MetricWrapperBase

from llmfleet.gateway.pool_metrics import LABELS, Labels, PoolMetrics, PoolSeries

__all__ = ["LABELS", "GatewayMetrics", "Labels", "Pace", "PoolMetrics"]

# The gateway's own time is sub-millisecond when healthy (target: added p99 <= 1.2 ms).
_OVERHEAD_BUCKETS = (
    0.00002, 0.00005, 0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.005, 0.01, 0.05,
)  # fmt: skip
_SCRAPE_LAG_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_GC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)
_LOOP_LAG_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)


class GatewayMetrics:
    def __init__(self, discovered: Callable[[], Mapping[str, Any]] | None = None) -> None:
        """`discovered`: discovery's `services`, counted on each read of /metrics."""
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        if discovered is not None:
            r.register(DiscoveredCollector(discovered))
        self._discovered = discovered
        self._pruned_against: Mapping[str, Any] | None = None
        # requests by outcome, latency histograms, retries, ejections, 429s, in flight
        self._pools = PoolSeries()
        r.register(self._pools)
        self._overhead = Histogram(
            "llmfleet_gateway_overhead_seconds",
            "Time the gateway itself adds, by route and phase: request (the client's body read "
            "to the upstream request handed to the wire; includes a traffic policy's deliberate "
            "hold, such as debounce.delayMs), response (the upstream's last byte read to the "
            "client's last byte written) and chunk (a streamed chunk taken from the engine to "
            "written to the client).",
            ("route", "phase"),
            buckets=_OVERHEAD_BUCKETS,
            registry=r,
        )
        self._overheads: dict[tuple[str, str], Any] = {}
        self.bad_requests = Counter(
            "llmfleet_gateway_bad_requests",
            "Requests the gateway refused itself as malformed or too big, by route and error "
            "code (invalid_request, body_too_large, body_read_timeout, ...).",
            ("route", "code"),
            registry=r,
        )
        self.internal_errors = Counter(
            "llmfleet_gateway_internal_errors",
            "Requests answered 500 because of an unexpected exception in the gateway (each is "
            "logged once with its traceback and request id).",
            ("route",),
            registry=r,
        )
        self.gc_pauses = Histogram(
            "llmfleet_gateway_gc_pause_seconds",
            "Python garbage-collector pauses, by generation (the start-up heap is frozen, so a "
            "full collection only walks objects created since).",
            ("generation",),
            buckets=_GC_BUCKETS,
            registry=r,
        )
        self.gc_pause_cpu = Histogram(
            "llmfleet_gateway_gc_pause_cpu_seconds",
            "The CPU time of each garbage-collector pause (the collecting thread's), by "
            "generation: what walking the heap cost. The wall time "
            "(llmfleet_gateway_gc_pause_seconds) also holds the thread's waits for a CPU.",
            ("generation",),
            buckets=_GC_BUCKETS,
            registry=r,
        )
        self.gc_refreezes = Counter(
            "llmfleet_gateway_gc_refreezes",
            "Times the heap was frozen again after a long full collection (the state traffic "
            "made since start-up; `refreeze_after_pause_seconds`).",
            registry=r,
        )
        self.loop_lag = Histogram(
            "llmfleet_gateway_event_loop_lag_seconds",
            "How late the event loop ran a timer that was due, sampled every 50 ms: what every "
            "request waits while something holds the loop (`loop_lag`).",
            buckets=_LOOP_LAG_BUCKETS,
            registry=r,
        )
        self.loop_lag_max = Gauge(
            "llmfleet_gateway_event_loop_lag_max_seconds",
            "The largest event-loop lag sampled since the gateway started.",
            registry=r,
        )
        self.loop_own_lag = Histogram(
            "llmfleet_gateway_event_loop_own_lag_seconds",
            "Each event-loop lag sample less the time the loop's thread waited for a CPU "
            "since the previous sample: a lower bound of the lag the gateway's own work made "
            "(`loop_lag`).",
            buckets=_LOOP_LAG_BUCKETS,
            registry=r,
        )
        self.loop_own_lag_max = Gauge(
            "llmfleet_gateway_event_loop_own_lag_max_seconds",
            "The largest own event-loop lag sampled since the gateway started.",
            registry=r,
        )
        self.loop_cpu_wait = Counter(
            "llmfleet_gateway_event_loop_cpu_wait_seconds",
            "Time the event loop's thread was ready to run but waited for a CPU (the kernel's "
            "run-queue wait): lag from busy cores, not from the gateway's work.",
            registry=r,
        )
        self.nonlocal_refused = Counter(
            "llmfleet_gateway_nonlocal_refused",
            "Connections refused before connecting because the destination is outside "
            "127.0.0.0/8 and ::1 (LLMFLEET_LOOPBACK_ONLY), by client (upstream, scrape).",
            ("client",),
            registry=r,
        )

        self.scrapes = Counter(
            "llmfleet_gateway_scrapes",
            "Scrapes of engines' /metrics by outcome: ok, failed (refused, an error status, "
            "unreadable), timeout (slower than scrape_timeout_seconds).",
            ("outcome",),
            registry=r,
        )
        self.scrape_endpoints = Gauge(
            "llmfleet_gateway_scrape_endpoints",
            "Engine endpoints by state: known (discovery lists them), active (routing read "
            "their figures within scrape_active_seconds: the ones scraped).",
            ("state",),
            registry=r,
        )
        self.scrape_lag = Histogram(
            "llmfleet_gateway_scrape_lag_seconds",
            "How late a scheduled scrape started after it was due (above a tick: "
            "scrape_concurrency is what limits the scraper).",
            buckets=_SCRAPE_LAG_BUCKETS,
            registry=r,
        )

        self.policies = PolicyMetrics(r)

    def pool(self, labels: Labels) -> PoolMetrics:
        """One pool's series (`pool_metrics`), made by its first request."""
        return self._pools.pool(labels)

    def forget_gone_pools(self) -> int:
        """Drop the series of pools whose service, model or revision discovery no longer has
        (and that have no request in flight); returns how many. A revision goes when a canary
        is promoted or rolled back: without this, each rollout would leave its old revision's
        ~55 series per pool in /metrics for as long as the service lives. On the event loop,
        where requests make pools; the work is done once per discovery snapshot (an unchanged
        one is the same object), so a read of /metrics between changes costs nothing here. A
        service that comes back starts its counters again from zero, which Prometheus reads as
        a reset."""
        if self._discovered is None:
            return 0
        try:
            services = self._discovered()
        except Exception:  # /metrics answers whatever discovery does (`DiscoveredCollector`)
            return 0
        if services is self._pruned_against:
            return 0
        self._pruned_against = services
        live = {
            (side.namespace, side.name, side.model, side.revision)
            for service in services.values()
            for side in (service, *((service.canary.service,) if service.canary else ()))
        }  # fmt: skip
        # Labels: namespace, service, pool, model, revision (`pool_metrics.LABELS`). The pool
        # is not matched: a service's outcomes before any pool of it exists carry its role.
        return self._pools.forget(
            lambda labels: (labels[0], labels[1], labels[3], labels[4]) not in live
        )

    def overhead(self, route: str, phase: str) -> Any:
        """The overhead histogram's child for one route and phase (looked up once)."""
        child = self._overheads.get((route, phase))
        if child is None:
            child = self._overheads[route, phase] = self._overhead.labels(route, phase)
        return child

    def exposition(self, pace: Pace | None = None, names: Collection[str] = ()) -> bytes:
        """The registry in Prometheus's text format; with `pace`, rendered in slices with a pause
        between them (`Pace`). With `names` (/metrics?name[]=...), only those families, unpaced:
        what a poll of one figure reads, whatever the size of the rest."""
        if names:
            return generate_latest(self.registry.restricted_registry(names))
        if pace is None:
            return generate_latest(self.registry)
        return _Paced(self.registry, pace).render()

    def exposition_chunks(self, pace: Pace, names: Collection[str] = ()) -> list[bytes]:
        """`exposition(pace, names)` in chunks of about `pace.chunk_bytes`, never joined into
        one buffer (what /metrics sends, one chunk after another)."""
        if names:
            return [self.exposition(pace, names)]
        return _Paced(self.registry, pace).chunks()


POLICY_LABELS = ("namespace", "service", "model")
"""Labels of every traffic-policy series (of the service the client named), plus its own."""
_CONFIDENCE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.99)


class PolicyMetrics:
    """Counters of the traffic policies (`policies/`), one family per decision."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.coalesced = Counter(
            "llmfleet_gateway_coalesced",
            "Requests answered by another identical request's upstream call (how: in_flight, "
            "or window for a finished answer reused within coalesce.windowMs).",
            (*POLICY_LABELS, "how"),
            registry=r,
        )
        self.coalesce_dropped = Counter(
            "llmfleet_gateway_coalesce_dropped_readers",
            "Coalesced stream readers dropped for falling too far behind the shared stream.",
            POLICY_LABELS,
            registry=r,
        )
        self.superseded = Counter(
            "llmfleet_gateway_superseded",
            "Requests superseded by a newer one of the same session (when: held, before "
            "dispatch; dispatched, upstream cancelled).",
            (*POLICY_LABELS, "when"),
            registry=r,
        )
        self.cascade_served = Counter(
            "llmfleet_gateway_cascade_served",
            "Cascaded requests by the tier (service) that answered and whether it escalated.",
            (*POLICY_LABELS, "tier", "escalated"),
            registry=r,
        )
        self.cascade_escalations = Counter(
            "llmfleet_gateway_cascade_escalations",
            "Answers of a tier discarded for the next one (reason: low_confidence, tier_failed).",
            (*POLICY_LABELS, "tier", "reason"),
            registry=r,
        )
        self.cascade_skipped = Counter(
            "llmfleet_gateway_cascade_skipped",
            "Tiers skipped by a heuristic (reason: long_prompt, keyword, header, unavailable).",
            (*POLICY_LABELS, "tier", "reason"),
            registry=r,
        )
        self.cascade_hedged = Counter(
            "llmfleet_gateway_cascade_hedged",
            "Requests sent to a cheap tier and this service at once (winner: cheap, large).",
            (*POLICY_LABELS, "winner"),
            registry=r,
        )
        self.cascade_confidence = Histogram(
            "llmfleet_gateway_cascade_confidence",
            "Confidence of cheap-tier answers (traffic.cascade.confidence of their logprobs).",
            (*POLICY_LABELS, "tier"),
            buckets=_CONFIDENCE_BUCKETS,
            registry=r,
        )
        self.degraded = Counter(
            "llmfleet_gateway_degraded",
            "Sheddable requests sent to a cheaper service because this one was saturated.",
            (*POLICY_LABELS, "to"),
            registry=r,
        )
        self.shed = Counter(
            "llmfleet_gateway_shed",
            "Requests refused (429) by priority admission, by priority class.",
            (*POLICY_LABELS, "priority"),
            registry=r,
        )
        self.truncated = Counter(
            "llmfleet_gateway_truncated",
            "Answers cut at traffic.limits.timeoutSeconds (kind: stream, partial, or "
            "timeout for a 504).",
            (*POLICY_LABELS, "kind"),
            registry=r,
        )


class DiscoveredCollector:
    """What discovery's current snapshot routes to, counted when /metrics is read (no work
    between reads): services, and serving endpoints by pool role. A change is routed as soon
    as these move, the figure a benchmark waits on."""

    def __init__(self, services: Callable[[], Mapping[str, Any]]) -> None:
        self._services = services

    def describe(self) -> list[GaugeMetricFamily]:
        """The families' names, so that /metrics?name[]= collects this only when asked."""
        return [
            GaugeMetricFamily("llmfleet_gateway_discovered_services", ""),
            GaugeMetricFamily("llmfleet_gateway_discovered_endpoints", "", labels=("role",)),
        ]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            services = self._services()
        except Exception:  # /metrics must answer whatever discovery does: these two go missing
            return
        yield GaugeMetricFamily(
            "llmfleet_gateway_discovered_services",
            "Models the gateway routes to (discovery's current snapshot).",
            value=len(services),
        )
        by_role: dict[str, int] = {}
        for service in services.values():
            for role, pool in service.pools.items():
                by_role[role] = by_role.get(role, 0) + len(pool.endpoints)
        endpoints = GaugeMetricFamily(
            "llmfleet_gateway_discovered_endpoints",
            "Serving endpoints in discovery's current snapshot, by pool role.",
            labels=("role",),
        )
        for role in sorted(by_role):
            endpoints.add_metric((role,), by_role[role])
        yield endpoints


@dataclass(frozen=True)
class Pace:
    """Render /metrics `work_seconds` at a time with `pause_seconds` of sleep between: at 1,000
    pools the exposition is ~56,000 series, ~0.4 s of CPU through prometheus_client's samples
    (bench/gateway_fleet_scale.py), ~30 ms since the per-pool series write their own text
    (`PoolSeries.text`). In a thread it shares the GIL with the event loop, which under load
    then got half of it and fell behind by 100-250 ms; paced, the render thread holds the GIL a
    millisecond at a time and leaves the loop three quarters of it (the render takes four times
    as long as its CPU)."""

    work_seconds: float = 0.001
    pause_seconds: float = 0.003
    check_every: int = 64
    """Samples made or rendered between two looks at the clock."""
    chunk_bytes: int = 256 * 1024
    """The render's pieces are joined into chunks this big, sent one after another: the whole
    exposition joined into one buffer was a single 4-5 ms call at 1,000 pools (7.7 MB; most of
    it the new buffer's page faults), held without a break for the event loop."""
    text_samples: int = 1024
    """Samples formatted into one piece of text: prometheus_client joins and encodes each piece
    in one call that holds the GIL throughout (the whole exposition at once took 8-17 ms at
    1,000 pools, once per scrape)."""


class _Paced:
    """The registry's exposition, rendered as prometheus_client's `generate_latest` renders it
    (the same bytes: tests/gateway/test_metrics_exposition.py) with pauses between slices of
    work (`Pace`); only the order of work in time changes:
    - a labelled metric's own `collect()` makes every child's samples in one go: at 1,000
      pools a histogram family is 14,000-18,000 samples, 45-65 ms of CPU with the GIL held
      throughout, which the event loop waited out 5 ms at a time (the interpreter's switch
      interval) on every callback that let the GIL go. So a metric's family is made here as its
      `collect()` makes it (`_family`), child by child with the same pauses; this reads
      prometheus_client's private `_get_metric`/`_samples`, and a collector without them is
      collected as it is;
    - samples are formatted `text_samples` at a time, each piece by `generate_latest` (a
      family's pieces after its first without the `# HELP`/`# TYPE` lines it repeats); a
      family with OpenMetrics-only samples (`_created`, `_gsum`, `_gcount`, which it lists
      after the others) in one piece."""

    def __init__(self, registry: CollectorRegistry, pace: Pace) -> None:
        self._registry = registry
        self._pace = pace
        self.check_every = pace.check_every
        self._slice_ends = 0.0

    def render(self) -> bytes:
        return b"".join(self.chunks())

    def chunks(self) -> list[bytes]:
        """The exposition in chunks of about `chunk_bytes` each, in order."""
        self._slice_ends = time.perf_counter() + self._pace.work_seconds
        chunks = _Chunks(self._pace.chunk_bytes)
        for family in self._families():
            if isinstance(family, list):  # text made by its collector (`PoolSeries.pieces`)
                for piece in family:  # joins of a chunk's size at most: short holds
                    chunks.add(piece)
                self.pause_if_due()
                continue
            samples = family.samples
            size = max(len(samples), 1) if _late_suffixes(family) else self._pace.text_samples
            for start in range(0, max(len(samples), 1), size):
                family.samples = _PacedSamples(samples[start : start + size], self)
                text = generate_latest(_OneFamily(family))
                chunks.add(text if start == 0 else text.split(b"\n", 2)[2])
                self.pause_if_due()
        return chunks.done()

    def _families(self) -> Iterator[Any]:
        collectors = getattr(self._registry, "_collector_to_names", None)
        if collectors is None or getattr(self._registry, "_target_info", None):
            # not prometheus_client's registry as this module knows it, or one with a
            # target_info family first: collected as it is
            yield from self._registry.collect()
            return
        for collector in list(collectors):
            if isinstance(collector, PoolSeries):
                # its text, made with pauses (~18 lines a pool in a histogram family)
                yield collector.pieces(self.pause_if_due, max(1, self.check_every // 16))
            elif isinstance(collector, MetricWrapperBase) and hasattr(collector, "_get_metric"):
                yield self._family(collector)
            else:
                yield from collector.collect()

    def _family(self, metric: MetricWrapperBase) -> Any:
        """`metric.collect()`'s one family, its samples made with pauses between."""
        family = metric._get_metric()  # type: ignore[no-untyped-call]
        every = self.check_every
        for index, sample in enumerate(metric._samples()):
            family.add_sample(metric._name + sample[0], *sample[1:])
            if index % every == every - 1:
                self.pause_if_due()
        return family

    def pause_if_due(self) -> None:
        if time.perf_counter() >= self._slice_ends:
            time.sleep(self._pace.pause_seconds)  # the GIL is free meanwhile
            self._slice_ends = time.perf_counter() + self._pace.work_seconds


class _Chunks:
    """Pieces of text joined into chunks of at least `size` bytes (the last may be less)."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._chunks: list[bytes] = []

    def add(self, piece: bytes) -> None:
        self._pending.append(piece)
        self._pending_bytes += len(piece)
        if self._pending_bytes >= self._size:
            self._flush()

    def done(self) -> list[bytes]:
        self._flush()
        return self._chunks

    def _flush(self) -> None:
        if self._pending:
            self._chunks.append(b"".join(self._pending))
            self._pending, self._pending_bytes = [], 0


_LATE_SUFFIXES = ("_created", "_gsum", "_gcount")
"""Samples `generate_latest` lists after a family's others, under a header of their own."""


def _late_suffixes(family: Any) -> bool:
    late = {family.name + suffix for suffix in _LATE_SUFFIXES}
    return any(sample.name in late for sample in family.samples)


class _OneFamily:
    """A collector of one family, for `generate_latest`."""

    def __init__(self, family: Any) -> None:
        self._family = family

    def collect(self) -> list[Any]:
        return [self._family]


class _PacedSamples(list[Any]):
    """A family's samples, iterated with a look at `paced`'s clock every `check_every`."""

    def __init__(self, samples: list[Any], paced: _Paced) -> None:
        super().__init__(samples)
        self._paced = paced

    def __iter__(self) -> Iterator[Any]:
        every = self._paced.check_every
        for index, sample in enumerate(super().__iter__()):
            if index % every == every - 1:
                self._paced.pause_if_due()
            yield sample
