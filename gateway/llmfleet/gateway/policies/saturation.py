"""Pure decisions of the priority stage (`priority.Admission`): is a pool saturated, and what
becomes of a request of a given priority class.

Saturation (`traffic.degradation`), from the engines' scraped figures (`EngineLoad`)::

    waiting  = mean of vllm:num_requests_waiting   over the pool's endpoints with fresh figures
    kv       = mean of vllm:kv_cache_usage_perc     over the same endpoints
    saturated  iff  waiting > maxQueueDepth  or  kv > maxKvCacheUsage (default slo.maxKvCacheUsage)

An endpoint whose figures are missing or stale (older than `metrics_stale_seconds`) does not
count; a pool with no fresh figures at all is NOT saturated. Without evidence of load the gateway
does not shed: a scraper outage must not turn into refusing traffic.

Admission by class, with `n` the requests this gateway has in flight to the pool, `C` its
`max_in_flight_per_pool` and a class's limit `max(1, floor(share x C))`::

    critical   admitted
    standard   refused while standard limit <= n < C, else admitted
    sheddable  offloaded when n >= sheddable limit or the pool is saturated, else admitted;
               offloaded: sent to the cheaper service when there is one, else refused

So the last part of a pool's capacity is kept for critical traffic and the part between the two
shares for critical and standard: as a pool fills, sheddable requests go first, then standard
ones, and critical ones are admitted until the pool is full. A full pool (n >= C) is the
forwarder's to refuse, for every class alike (429 `pool_saturated`), except that sheddable
requests still go to the cheaper service. A limit is at least 1, so an idle pool admits any
request whatever the shares. Saturation counts only for sheddable requests (and only where
degradation is enabled): standard and critical ones never leave the service they asked for.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from llmfleet.gateway.endpoints import EngineLoad

if TYPE_CHECKING:
    from llmfleet.gateway.proxy import Priority


@dataclass(frozen=True)
class PoolLoad:
    """Mean scraped figures over the endpoints of a pool that reported fresh ones."""

    reporting: int
    waiting: float
    kv_usage: float


def pool_load(figures: Iterable[EngineLoad | None]) -> PoolLoad | None:
    """The pool's mean load from each endpoint's fresh figures (None: missing or stale);
    None when no endpoint has fresh figures."""
    fresh = [load for load in figures if load is not None]
    if not fresh:
        return None
    count = len(fresh)
    waiting = sum(load.waiting for load in fresh) / count
    return PoolLoad(count, waiting, sum(load.kv_usage for load in fresh) / count)


def saturation(load: PoolLoad | None, max_queue_depth: float, max_kv_usage: float) -> str | None:
    """Why the pool is saturated (for logs), or None when it is not or nothing is known."""
    if load is None:
        return None
    if load.waiting > max_queue_depth:
        return f"mean waiting requests {load.waiting:g} > maxQueueDepth {max_queue_depth:g}"
    if load.kv_usage > max_kv_usage:
        return f"mean KV-cache usage {load.kv_usage:g} > {max_kv_usage:g}"
    return None


@dataclass(frozen=True)
class Shares:
    """Fractions of a pool's in-flight capacity up to which each class is admitted."""

    sheddable: float
    standard: float


Action = Literal["admit", "offload", "refuse"]


@dataclass(frozen=True)
class Verdict:
    action: Action
    """admit: pass on; offload: to the cheaper service if any, else refuse; refuse: 429."""
    reason: str = ""


ADMIT = Verdict("admit")


def admit(
    priority: Priority, in_flight: int, capacity: int, shares: Shares, saturated: str | None
) -> Verdict:
    """What becomes of a request of class `priority` (see the module's rule). `saturated` is
    `saturation(...)` of the pool, or None (not saturated, or degradation is off)."""
    if priority == "critical":
        return ADMIT
    share = shares.standard if priority == "standard" else shares.sheddable
    limit = max(1, int(share * capacity + 1e-9))  # floor, robust to 0.7 * 10 = 6.9999...
    reason = f"{in_flight} in flight, {priority} share {share:g} of {capacity} is {limit}"
    if priority == "standard":
        return Verdict("refuse", reason) if limit <= in_flight < capacity else ADMIT
    if in_flight >= limit:
        return Verdict("offload", reason)
    if saturated is not None:
        return Verdict("offload", f"pool saturated: {saturated}")
    return ADMIT
