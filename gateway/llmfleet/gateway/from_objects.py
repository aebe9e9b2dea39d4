"""How InferenceServices and their pools' EndpointSlices become the gateway's routed Services
(pure: objects in, services out), and what changed between two such snapshots.

`snapshot` builds every service from every object (reusing what `Built` kept from unchanged
ones); `kept_snapshot.KeptSnapshot` rebuilds only the services a change touches, through the same
per-service code (`service_pools`, `service_of`): both give the same snapshot.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, cast

from pydantic import ValidationError

from llmfleet.crds import InferenceService
from llmfleet.crds import labels as L
from llmfleet.crds.claims import claim_order
from llmfleet.crds.inference_service import CanaryPhase, InferenceServiceSpec
from llmfleet.gateway.discovery import Pool, Role, Service, Split

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
PoolOf = Callable[[str, str, Role], Pool]
"""(namespace, pool Service name, role) -> the Pool of that Service's ready endpoints."""
Canary = tuple[str, dict[Role, Pool], int]
"""A running canary's revision, pools and weight (`_canary_pools`)."""


def ready_urls(slices: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
    urls: set[str] = set()
    for endpoint_slice in slices:
        ports = [p for p in endpoint_slice.get("ports") or [] if p.get("name") == "http"]
        if not ports:
            continue
        port = ports[0]["port"]
        for endpoint in endpoint_slice.get("endpoints") or []:
            conditions = endpoint.get("conditions") or {}
            # `ready` is unset only for old producers; terminating pods are never ready.
            if conditions.get("ready", True) and not conditions.get("terminating", False):
                urls.update(f"http://{address}:{port}" for address in endpoint["addresses"][:1])
    return tuple(sorted(urls))


class Specs:
    """Parsed specs by (namespace, name), each kept while its generation (and uid) holds: a
    spec is validated once per generation, not once per pass."""

    def __init__(self) -> None:
        self._parsed: dict[tuple[str, str], tuple[tuple[str, int], InferenceServiceSpec | str]] = {}

    def parse(self, obj: Mapping[str, Any]) -> InferenceServiceSpec | str:
        """The object's spec, or what is wrong with it."""
        metadata = obj["metadata"]
        key = (metadata["namespace"], metadata["name"])
        generation = metadata.get("generation")
        stamp = (str(metadata.get("uid") or ""), int(generation)) if generation else None
        kept = self._parsed.get(key)
        if stamp is not None and kept is not None and kept[0] == stamp:
            return kept[1]
        parsed: InferenceServiceSpec | str
        try:
            parsed = InferenceService.model_validate({"metadata": {}, "spec": obj["spec"]}).spec
        except ValidationError as error:
            parsed = f"invalid spec: {error}"
        if stamp is not None:
            self._parsed[key] = (stamp, parsed)
        return parsed

    def forget(self, key: tuple[str, str]) -> None:
        """Forget a deleted service."""
        self._parsed.pop(key, None)

    def keep_only(self, keys: set[tuple[str, str]]) -> None:
        """Forget the services no longer listed."""
        for gone in self._parsed.keys() - keys:
            del self._parsed[gone]


class Built:
    """What the last snapshot built, for the next one to reuse: each pool's `Pool` with the
    EndpointSlice objects it was made from, each service's `Service` with its object and pools.
    The informers replace an object when it changes and keep it otherwise, so an input that is
    the same object (`is`) gives the same output: a rebuild after one change makes new objects
    for the services that change touched and reuses the rest (at 1,000 services x 10 endpoints
    a whole rebuild was ~20-30 ms of a worker thread holding the GIL; the diff of two snapshots,
    on the event loop, 2-6 ms, now a look at each service's identity)."""

    def __init__(self) -> None:
        self._pools: dict[tuple[str, str, Role], tuple[list[Mapping[str, Any]], Pool]] = {}
        self._services: dict[
            tuple[str, str], tuple[Mapping[str, Any], tuple[Pool, ...], Service]
        ] = {}
        self._next_pools: dict[tuple[str, str, Role], tuple[list[Mapping[str, Any]], Pool]] = {}
        self._next_services: dict[
            tuple[str, str], tuple[Mapping[str, Any], tuple[Pool, ...], Service]
        ] = {}

    def pool(self, slices: list[Mapping[str, Any]], namespace: str, name: str, role: Role) -> Pool:
        """Pool `role` with the ready endpoints of `slices` (those of Service `name`)."""
        key = (namespace, name, role)
        kept = self._pools.get(key)
        if kept is None or not same_objects(kept[0], slices):
            kept = (slices, Pool(role, ready_urls(slices)))
        self._next_pools[key] = kept
        return kept[1]

    def service(self, obj: Mapping[str, Any], pools: tuple[Pool, ...]) -> Service | None:
        """The Service built before from the same `obj` and `pools`; None if there is none."""
        metadata = obj["metadata"]
        key = (metadata["namespace"], metadata["name"])
        kept = self._services.get(key)
        if kept is None or kept[0] is not obj or not same_objects(kept[1], pools):
            return None
        self._next_services[key] = kept
        return kept[2]

    def keep(self, obj: Mapping[str, Any], pools: tuple[Pool, ...], service: Service) -> Service:
        """`service`, built from `obj` and `pools`, kept for the next snapshot."""
        metadata = obj["metadata"]
        self._next_services[metadata["namespace"], metadata["name"]] = (obj, pools, service)
        return service

    def done(self) -> None:
        """Keep what this snapshot used, for the next one; forget the rest."""
        self._pools, self._next_pools = self._next_pools, {}
        self._services, self._next_services = self._next_services, {}


def same_objects(before: Sequence[object], now: Sequence[object]) -> bool:
    return len(before) == len(now) and all(a is b for a, b in zip(before, now, strict=True))


def snapshot(
    services: Iterable[Mapping[str, Any]],
    slices: Iterable[Mapping[str, Any]],
    problems: list[str] | None = None,
    specs: Specs | None = None,
    built: Built | None = None,
) -> dict[str, Service]:
    """Served model name -> Service, from InferenceService and EndpointSlice objects.

    A service left out (an invalid spec, a model name another service already serves) is
    said in `problems`, one line each, for the caller to log once per change (not once per
    pass); `specs` keeps parsed specs across calls, `built` what was built from unchanged
    objects (`Built`)."""
    said = problems if problems is not None else []
    specs = specs or Specs()
    built = built or Built()
    by_service: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for endpoint_slice in slices:
        metadata = endpoint_slice["metadata"]
        owner = (metadata.get("labels") or {}).get(SERVICE_NAME_LABEL)
        if owner:
            by_service.setdefault((metadata["namespace"], owner), []).append(endpoint_slice)

    def pool_of(namespace: str, pool_service: str, role: Role) -> Pool:
        slices_of = by_service.get((namespace, pool_service), [])
        return built.pool(slices_of, namespace, pool_service, role)

    found: dict[str, Service] = {}
    # The first claimant of a model name gets it (`claims.claim_order`), in every replica.
    for obj in sorted(services, key=claim_order):
        metadata = obj["metadata"]
        namespace, name = metadata["namespace"], metadata["name"]
        if metadata.get("deletionTimestamp"):
            continue
        spec = specs.parse(obj)
        if isinstance(spec, str):
            said.append(invalid_line(namespace, name, spec))
            continue
        pools, canary = service_pools(obj, spec, pool_of)
        model = spec.served_name
        if model in found:
            said.append(conflict_line(model, found[model], namespace, name))
            continue
        used = (*pools.values(), *(canary[1].values() if canary else ()))
        kept = built.service(obj, used)
        if kept is None:
            kept = built.keep(obj, used, service_of(obj, spec, pools, canary))
        found[model] = kept
    built.done()
    return found


def service_pools(
    obj: Mapping[str, Any], spec: InferenceServiceSpec, pool_of: PoolOf
) -> tuple[dict[Role, Pool], Canary | None]:
    """The pools a valid InferenceService routes to now (`_while_switching`) and its canary's,
    each from `pool_of`."""
    metadata = obj["metadata"]
    namespace, name = metadata["namespace"], metadata["name"]

    def pool(role: Role) -> Pool:
        return pool_of(namespace, L.pool_service_name(name, role), role)

    pools = _while_switching({cast(Role, role): pool(cast(Role, role)) for role in spec.pools()},
                             pool)  # fmt: skip
    status = obj.get("status") or {}
    canary = _canary_pools(namespace, name, tuple(pools), status.get("canary"), pool_of)
    return pools, canary


def service_of(
    obj: Mapping[str, Any],
    spec: InferenceServiceSpec,
    pools: dict[Role, Pool],
    canary: Canary | None,
) -> Service:
    """The Service a valid InferenceService is routed as (`service_pools` gave its pools)."""
    metadata, status = obj["metadata"], obj.get("status") or {}
    stable = Service(
        model=spec.served_name, namespace=metadata["namespace"], name=metadata["name"],
        pools=pools, traffic=spec.traffic, slo=spec.slo,
        max_model_len=spec.model.max_model_len, revision=str(status.get("revision") or ""),
    )  # fmt: skip
    return _with_canary(stable, canary)


def invalid_line(namespace: str, name: str, why: str) -> str:
    return f"skipping {namespace}/{name}: {why}"


def conflict_line(model: str, first: Service, namespace: str, name: str) -> str:
    return (f"model {model!r} is served by {first.namespace}/{first.name} and "
            f"{namespace}/{name}; routing to the first created")  # fmt: skip


CANARY_PHASES = (CanaryPhase.PROGRESSING, CanaryPhase.PAUSED, CanaryPhase.PROMOTING)
"""Phases in which a canary takes its share of the traffic (`status.canary.weight`)."""


def _canary_pools(
    namespace: str,
    name: str,
    roles: tuple[Role, ...],
    canary: Mapping[str, Any] | None,
    pool_of: PoolOf,
) -> Canary | None:
    """The canary its status publishes, if one runs: its revision, its pools (the Services the
    operator names after its revision, `labels.revision_child_name`, whose EndpointSlices list
    the canary pods that serve its share) and its weight."""
    if not canary or canary.get("phase") not in CANARY_PHASES or not canary.get("revision"):
        return None
    revision = str(canary["revision"])
    pools = {role: pool_of(namespace, L.revision_child_name(name, role, revision), role)
             for role in roles}  # fmt: skip
    return revision, pools, int(canary.get("weight") or 0)


def _with_canary(stable: Service, canary: Canary | None) -> Service:
    """`stable` with its canary's share (`_canary_pools`), if one runs."""
    if canary is None:
        return stable
    revision, pools, weight = canary
    service = replace(stable, pools=pools, revision=revision)
    return replace(stable, canary=Split.of(service, weight))


def _while_switching(pools: dict[Role, Pool], pool: Callable[[Role], Pool]) -> dict[Role, Pool]:
    """The spec's pools, or, while a topology change is under way and the spec's serving pool
    has no ready endpoint yet, the other topology's pools that still serve: the operator keeps
    the old pool serving until the new ones are ready (make before break), and so does routing.
    Unified -> Disaggregated serves from `unified` until `decode` has an endpoint (decode
    engines can prefill alone until `prefill` has one); the way back serves from
    prefill/decode until `unified` has one."""
    serving: Role = "decode" if "decode" in pools else "unified"
    if pools[serving].endpoints:
        return pools
    if serving == "unified":
        decode = pool("decode")
        return {"prefill": pool("prefill"), "decode": decode} if decode.endpoints else pools
    unified = pool("unified")
    return {"unified": unified} if unified.endpoints else pools


def changes(before: Mapping[str, Service], after: Mapping[str, Service]) -> list[str]:
    """One line per model or pool whose serving endpoints changed between two snapshots: the
    gateway's log then says when a pool lost or gained endpoints (what a 503 `no_endpoint`
    follows from), without a line per refresh."""
    lines = []
    for model in sorted(before.keys() - after.keys()):
        lines.append(f"model {model!r} is gone")
    # a service built from the same objects (`Built`) is the same object: nothing of it changed
    for model, service in sorted((m, s) for m, s in after.items() if before.get(m) is not s):
        old = before.get(model)
        where = f"{service.namespace}/{service.name}"
        if old is None:
            lines.append(f"model {model!r} served by {where}")
        for role, pool in sorted(service.pools.items()):
            was = old.pools.get(role) if old is not None else None
            if was is None or was.endpoints != pool.endpoints:
                endpoints = ", ".join(pool.endpoints) or "none"
                lines.append(
                    f"model {model!r} ({where}) pool {role}: serving endpoints {endpoints}"
                )
        for role in sorted(old.pools.keys() - service.pools.keys()) if old is not None else ():
            lines.append(f"model {model!r} ({where}) pool {role}: no longer routed to")
        lines += _canary_changes(model, where, old.canary if old else None, service.canary)
    return lines


def _canary_changes(model: str, where: str, before: Split | None, after: Split | None) -> list[str]:
    """Lines for a canary that starts, changes weight or endpoints, or ends."""
    if after is None:
        return (
            [f"model {model!r} ({where}): canary {before.service.revision} ended"] if before else []
        )
    canary = after.service
    said = f"model {model!r} ({where}) canary {canary.revision}"
    lines = []
    if before is None or (before.service.revision, before.weight) != (
        canary.revision,
        after.weight,
    ):
        lines.append(f"{said}: weight {after.weight}% (stable {100 - after.weight}%)")
    for role, pool in sorted(canary.pools.items()):
        was = before.service.pools.get(role) if before is not None else None
        if was is None or was.endpoints != pool.endpoints:
            lines.append(
                f"{said} pool {role}: serving endpoints {', '.join(pool.endpoints) or 'none'}"
            )
    return lines
