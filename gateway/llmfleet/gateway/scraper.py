"""Reads every known engine's /metrics on an interval into the endpoint table.

A failed or slow scrape leaves the endpoint's last figures in place; they age out after
`metrics_stale_seconds` (the table then reports zeros, and routing leans on the gateway's own
in-flight counts, which are always current).
"""

from __future__ import annotations

import asyncio
import logging

import httpx

from llmfleet.core import vllm_metrics
from llmfleet.gateway.discovery import Discovery
from llmfleet.gateway.endpoints import EndpointTable, EngineLoad

log = logging.getLogger("llmfleet.gateway.scraper")

LOAD_SERIES = (
    vllm_metrics.WAITING,
    vllm_metrics.RUNNING,
    vllm_metrics.KV_CACHE_USAGE,
    vllm_metrics.GPU_CACHE_USAGE,
)
"""The only series a scrape reads out of the engine's exposition."""


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
    return {
        url
        for service in discovery.services().values()
        for pool in service.pools.values()
        for url in pool.endpoints
    }


async def scrape_once(client: httpx.AsyncClient, table: EndpointTable, url: str) -> bool:
    try:
        response = await client.get(url + "/metrics")
        response.raise_for_status()
    except httpx.HTTPError as error:
        log.debug("endpoint=%s scrape failed: %s", url, error)
        return False
    table.record_load(url, engine_load(response.text))
    return True


async def scrape_forever(
    client: httpx.AsyncClient, table: EndpointTable, discovery: Discovery, interval: float
) -> None:
    while True:
        urls = known_urls(discovery)
        table.retain(urls)
        await asyncio.gather(*(scrape_once(client, table, url) for url in urls))
        await asyncio.sleep(interval)
