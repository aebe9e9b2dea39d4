"""Admission by priority class, and degradation of sheddable traffic under load.

A call's class (`call.priority`: its tenant's, or lower by `x-llmfleet-priority`) decides what
happens when the service's serving pool fills up; the rule is `saturation.admit`:

- critical requests are always passed on (the forwarder's `max_in_flight_per_pool` still holds,
  for every class: 429 `pool_saturated` once the pool is full);
- standard requests are refused (429, code `shed`) once this gateway has `standard_share` of
  the pool's capacity in flight, keeping the rest for critical ones;
- sheddable requests are offloaded once `sheddable_share` of it is in flight, or, with
  `traffic.degradation.enabled`, once the pool is saturated by its engines' scraped figures
  (mean waiting requests over `maxQueueDepth`, or mean KV-cache usage over `maxKvCacheUsage`,
  default `slo.maxKvCacheUsage`; missing or stale figures never count as saturated).

Offloading sends the request to the cheaper service (`degradation.service`, else the first
cascade tier, in the same namespace) with the body's `model` rewritten, and marks the answer
`x-llmfleet-tier: <service>` and `x-llmfleet-degraded: true`. Without degradation, or when the
cheaper service is unknown or has no endpoints, the request is refused with 429 and
`Retry-After`. Each offload or refusal is one log line and one count (`degraded` by target,
`shed` by class).

The in-flight figure is this gateway replica's own count (it is exact and current, where scraped
figures lag and include other replicas' traffic); per-tenant rate limits apply before this stage
and are unchanged by it.
"""

from __future__ import annotations

import logging

from starlette.responses import Response

from llmfleet.gateway.discovery import Service
from llmfleet.gateway.errors import error_response
from llmfleet.gateway.policies.base import Handler, PolicyDeps
from llmfleet.gateway.policies.saturation import PoolLoad, Shares, admit, pool_load, saturation
from llmfleet.gateway.proxy import Call, Failure

log = logging.getLogger("llmfleet.gateway.policies")

TIER_HEADER = "x-llmfleet-tier"
DEGRADED_HEADER = "x-llmfleet-degraded"


class Admission:
    def __init__(self, deps: PolicyDeps) -> None:
        self.deps = deps
        settings = deps.settings
        self.shares = Shares(settings.sheddable_share, settings.standard_share)

    async def __call__(self, call: Call, next: Handler) -> Response:
        if call.priority == "critical":
            return await next(call)
        service = call.service
        degradation = service.traffic.degradation
        saturated = None
        if call.priority == "sheddable" and degradation.enabled:
            max_kv = degradation.max_kv_cache_usage or service.slo.max_kv_cache_usage
            saturated = saturation(self._load(service), degradation.max_queue_depth, max_kv)
        in_flight = self.deps.forwarder.in_flight(service.model, service.serving_pool)
        capacity = self.deps.settings.max_in_flight_per_pool
        verdict = admit(call.priority, in_flight, capacity, self.shares, saturated)
        if verdict.action == "admit":
            return await next(call)
        target = self._cheaper(service) if verdict.action == "offload" else None
        if target is None:
            raise self._shed(call, verdict.reason)
        return await self._degrade(call, target, verdict.reason, next)

    def _load(self, service: Service) -> PoolLoad | None:
        """The serving pool's mean load from its endpoints' fresh scraped figures."""
        endpoints = service.pools[service.serving_pool].endpoints
        return pool_load(self.deps.table.fresh_loads(endpoints))

    def _cheaper(self, service: Service) -> Service | None:
        """The service degraded traffic goes to, when it exists and has endpoints."""
        degradation = service.traffic.degradation
        if not degradation.enabled:
            return None
        name = degradation.service
        if name is None and service.traffic.cascade.tiers:
            name = service.traffic.cascade.tiers[0].service
        target = self.deps.discovery.by_name(service.namespace, name) if name else None
        if target is None or target is service:
            return None
        if not target.pools[target.serving_pool].endpoints:
            return None
        return target

    async def _degrade(self, call: Call, target: Service, reason: str, next: Handler) -> Response:
        log.info(
            "request_id=%s priority=%s service=%s/%s degraded to %s: %s",
            call.request_id, call.priority, call.service.namespace, call.service.name,
            target.name, reason,
        )  # fmt: skip
        self.deps.metrics.policies.degraded.labels(*call.policy_labels(), target.name).inc()
        body = {**call.parsed.body, "model": target.model}
        marks = {TIER_HEADER: target.name, DEGRADED_HEADER: "true"}
        try:
            response = await next(call.retarget(target, body))
        except Failure as failure:
            failure.response.headers.update(marks)
            raise
        response.headers.update(marks)
        return response

    def _shed(self, call: Call, reason: str) -> Failure:
        service = call.service
        log.info(
            "request_id=%s priority=%s service=%s/%s shed: %s",
            call.request_id, call.priority, service.namespace, service.name, reason,
        )  # fmt: skip
        self.deps.metrics.policies.shed.labels(*call.policy_labels(), call.priority).inc()
        message = (
            f"the service {service.name!r} is at capacity for {call.priority} requests "
            f"({reason}); retry later"
        )
        retry = str(self.deps.settings.retry_after_seconds)
        response = error_response(429, message, code="shed", headers={"Retry-After": retry})
        return Failure(response, "shed")
