"""Reads every known engine's /metrics on an interval into the endpoint table.

A failed or slow scrape leaves the endpoint's last figures in place; they age out after
`metrics_stale_seconds` (the table then reports zeros, and routing leans on the gateway's own
in-flight counts, which are always current).
"""

from __future__ import annotations

import asyncio
import logging

import httpx

from llmfleet.gateway.discovery import Discovery
from llmfleet.gateway.endpoints import EndpointTable, parse_engine_metrics

log = logging.getLogger("llmfleet.gateway.scraper")


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
    table.record_load(url, parse_engine_metrics(response.text))
    return True


async def scrape_forever(
    client: httpx.AsyncClient, table: EndpointTable, discovery: Discovery, interval: float
) -> None:
    while True:
        urls = known_urls(discovery)
        table.retain(urls)
        await asyncio.gather(*(scrape_once(client, table, url) for url in urls))
        await asyncio.sleep(interval)
