"""Reads the active engines' /metrics into the endpoint table, spread over the interval.

What routing needs, and where it comes from:

- its own in-flight requests and tokens per endpoint: exact and free, counted by the forwarder
  (`EndpointTable.begin`/`end`), whatever the scraper does;
- each engine's queue, running batch and KV usage: scraped here, only for endpoints routing read
  within `scrape_active_seconds` and since their last scrape (`scrape_plan`), each at most once
  per `scrape_interval_seconds`, with at most `scrape_concurrency` scrapes in flight and
  `scrape_max_per_second` a second. So the scraper's cost follows this replica's traffic, not
  the fleet's size: an idle pool costs no GET, a replica that serves a few pools of a thousand
  scrapes those few, and a tick looks only at the endpoints due.

A pool that gets its first request (or its first after `scrape_active_seconds` idle) routes on
the in-flight counts alone until its first scrape lands (a tick, at most `TICK_SECONDS`, plus
the GET): its endpoints read as never scraped (zeros), not as stale, so the `healthy` filter
keeps them and the load scorers see only what this replica sent them.

A failed or slow scrape (over `scrape_timeout_seconds`, the whole GET) leaves the endpoint's last
figures in place; they age out after `metrics_stale_seconds` (the table then reports zeros).
What happens is counted: `llmfleet_gateway_scrapes_total{outcome}`,
`llmfleet_gateway_scrape_endpoints{state}` (known, active), and
`llmfleet_gateway_scrape_lag_seconds` (how late a scrape started after it was due: above a tick
the concurrency bound is what limits it). `llmfleet sim --scrape-seconds` measures what older
figures cost in routing quality (README, "Engine metrics at fleet scale").
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Mapping

from llmfleet.core import vllm_metrics
from llmfleet.gateway.discovery import Discovery, Service
from llmfleet.gateway.endpoints import Clock, EndpointTable, EngineLoad
from llmfleet.gateway.metrics import GatewayMetrics
from llmfleet.gateway.scrape_plan import Schedule
from llmfleet.gateway.settings import GatewaySettings
from llmfleet.gateway.upstream import Upstream, UpstreamError, UpstreamTimeout

log = logging.getLogger("llmfleet.gateway.scraper")

LOAD_SERIES = (
    vllm_metrics.WAITING,
    vllm_metrics.RUNNING,
    vllm_metrics.KV_CACHE_USAGE,
    vllm_metrics.GPU_CACHE_USAGE,
)
"""The only series a scrape reads out of the engine's exposition."""

TICK_SECONDS = 0.05
"""The scraper looks for due scrapes this often (or 4 times an interval, if that is more
often): the longest a newly active pool waits for its first scrape to start, and the grain
scrapes are spread at. A tick walks the active endpoints only."""

JITTER = 0.2
"""Each next scrape is due one interval later ±10% (`scrape_plan.next_due`)."""


def engine_load(text: str) -> EngineLoad:
    """The load figures in an engine's /metrics text (absent or NaN figures read as 0).

    Queue and batch sizes are summed over their label sets (several models or data-parallel
    engines behind one port); KV usage is the maximum instead, since the fullest cache is what
    limits the endpoint, and the older `vllm:gpu_cache_usage_perc` counts only when no
    `vllm:kv_cache_usage_perc` sample is a number.
    """
    found = vllm_metrics.read(text, LOAD_SERIES)
    kv_usage = vllm_metrics.highest(found[vllm_metrics.KV_CACHE_USAGE])
    if kv_usage is None:
        kv_usage = vllm_metrics.highest(found[vllm_metrics.GPU_CACHE_USAGE])
    return EngineLoad(
        waiting=vllm_metrics.total(found[vllm_metrics.WAITING]) or 0.0,
        running=vllm_metrics.total(found[vllm_metrics.RUNNING]) or 0.0,
        kv_usage=kv_usage or 0.0,
    )


def known_urls(discovery: Discovery) -> set[str]:
    """Every endpoint URL of every pool discovery lists (canaries' pools included)."""
    urls: set[str] = set()
    for service in discovery.services().values():
        revisions = [service] if service.canary is None else [service, service.canary.service]
        for revision in revisions:
            for pool in revision.pools.values():
                urls.update(pool.endpoints)
    return urls


class Scraper:
    """The scrape loop of one gateway replica (`forever`), over the shared endpoint table.

    `upstream` GETs the engines' /metrics: in production the gateway's own client
    (`wire.WireUpstream`, a pool of its own), a fraction of httpx's CPU per GET
    (bench/scrape_cost.py). Only the event loop's thread runs it, like everything that touches
    the table. `clock` is
    the table's (the plan's times); the ticks themselves sleep in real time. `draw` gives the
    jitter's random numbers in [0, 1)."""

    def __init__(
        self,
        upstream: Upstream,
        table: EndpointTable,
        discovery: Discovery,
        metrics: GatewayMetrics,
        settings: GatewaySettings,
        *,
        clock: Clock = time.monotonic,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self._upstream = upstream
        self._table = table
        self._discovery = discovery
        self._metrics = metrics
        self._interval = settings.scrape_interval_seconds
        self._timeout = settings.scrape_timeout_seconds
        self._concurrency = settings.scrape_concurrency
        self._clock = clock
        self._schedule = Schedule(
            interval=settings.scrape_interval_seconds,
            active_seconds=settings.scrape_active_seconds,
            per_second=settings.scrape_max_per_second,
            jitter=JITTER,
            draw=draw,
        )
        self._busy: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._retained: Mapping[str, Service] | None = None
        """Discovery's snapshot at the last `retain`."""
        self._outcomes = {o: metrics.scrapes.labels(o) for o in ("ok", "failed", "timeout")}

    async def forever(self) -> None:
        """Tick until cancelled; the scrapes still in flight are cancelled with it."""
        loop = asyncio.get_running_loop()
        pause = min(TICK_SECONDS, self._interval / 4)
        retain_at = loop.time()
        try:
            while True:
                if loop.time() >= retain_at:
                    self.retain()
                    retain_at = loop.time() + self._interval
                self.tick()
                await asyncio.sleep(pause)
        finally:
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def retain(self) -> None:
        """Forget endpoints discovery no longer lists (once per interval: it walks them all,
        unless discovery's snapshot is the very object it was last time)."""
        services = self._discovery.services()
        if services is self._retained:
            return
        self._retained = services
        known = known_urls(self._discovery)
        self._table.retain(known)
        self._schedule.retain(known)
        self._metrics.scrape_endpoints.labels("known").set(len(known))

    def tick(self) -> None:
        """Start the scrapes that are due now (within the bounds), forget the idle endpoints."""
        now = self._clock()
        self._schedule.arrive(self._table.take_arrived())
        chosen = self._schedule.take(
            self._table.reads, self._busy, now, slots=self._concurrency - len(self._busy)
        )
        for url in chosen.idle:
            self._table.forget_figures(url)
        for late in chosen.late:
            self._metrics.scrape_lag.observe(max(0.0, late))
        for url in chosen.start:
            self._busy.add(url)
            task = asyncio.create_task(self._scrape(url))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self._metrics.scrape_endpoints.labels("active").set(len(self._table.reads))

    async def _scrape(self, url: str) -> None:
        try:
            outcome = await self._get(url)
        finally:
            self._busy.discard(url)
        self._outcomes[outcome].inc()

    async def _get(self, url: str) -> str:
        try:
            async with asyncio.timeout(self._timeout):
                response = await self._upstream.get(url + "/metrics", self._timeout)
                try:
                    if response.status_code != 200:
                        log.debug("endpoint=%s scrape answered %d", url, response.status_code)
                        return "failed"
                    body = await response.aread()
                finally:
                    await response.aclose()
        except (TimeoutError, UpstreamTimeout) as error:
            log.debug("endpoint=%s scrape timed out: %r", url, error)
            return "timeout"
        except UpstreamError as error:
            log.debug("endpoint=%s scrape failed: %s", url, error)
            return "failed"
        except Exception as error:  # a bug in a client, say: one endpoint's, not the loop's
            log.warning("endpoint=%s scrape failed: %r", url, error)
            return "failed"
        if url in self._table.reads:  # still active: an idle endpoint keeps no figures
            self._table.record_load(url, engine_load(body.decode("utf-8", "replace")))
        return "ok"
