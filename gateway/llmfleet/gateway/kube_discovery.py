"""Discovery from the Kubernetes API: InferenceServices and their pools' EndpointSlices.

The operator's pool Services select only serving pods, so Kubernetes' own EndpointSlices list
exactly the endpoints that may receive new requests: a promoted spare appears, a demoted pod
disappears, without the gateway knowing about spares at all.

`snapshot()` is pure (objects in, services out); `kubernetes_lister` keeps both kinds in memory
(only the fields `snapshot` reads: `kept_service`, `kept_slice`) by watches
(`llmfleet.core.informer`: a LIST, then a WATCH resumed from its resourceVersion, a new LIST on
410 Gone), and `KubeDiscovery` rebuilds the snapshot from that memory (no API request) when the
watches saw a change: woken by the informers (`Changes`), after `SETTLE_SECONDS` so that a burst
of events makes one rebuild, parsing each spec once per generation and building anew only the
services whose objects changed (`Built`), in a worker thread that also diffs it with the current
one for the log, and swaps it in one assignment, so `services()` stays a cheap read on every
request. With nothing
changed nothing is rebuilt (the snapshot is a function of the objects alone), so an idle fleet
costs no work however large; a lister without `changes` (a static one, in tests) is re-read
every `interval` seconds instead. A conflict (two services claiming one model name) or an
invalid spec is logged when it appears and when it ends, not on every pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

from pydantic import ValidationError

from llmfleet.core.informer import Informer, client_informer
from llmfleet.core.tasks import cancel_and_wait
from llmfleet.crds import GROUP, PLURAL, VERSION, InferenceService
from llmfleet.crds import labels as L
from llmfleet.crds.claims import claim_order
from llmfleet.crds.inference_service import CanaryPhase, InferenceServiceSpec
from llmfleet.gateway.discovery import Pool, Role, Service, Split, index_by_name

log = logging.getLogger("llmfleet.gateway.discovery")
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
SETTLE_SECONDS = 0.05
"""How long a woken discovery waits for more events before it rebuilds (one rebuild per burst)."""

Lister = Callable[[], tuple[list[dict[str, Any]], list[dict[str, Any]]]]
"""Returns (InferenceService objects, EndpointSlice objects) as plain dicts."""


def _ready_urls(slices: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
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


def kept_service(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What discovery keeps of an InferenceService (the informer's transform): its metadata
    without managedFields, its spec, and of its status the revision and canary `snapshot`
    reads. A full garbage collection walks every object kept, so what is not read is not kept
    (`gc_pauses`)."""
    metadata = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    status = obj.get("status") or {}
    return {
        "metadata": metadata,
        "spec": obj.get("spec"),
        "status": {k: status[k] for k in ("revision", "canary") if k in status},
    }


def kept_slice(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What discovery keeps of an EndpointSlice: the metadata the informer and `snapshot` read
    (namespace, name, resourceVersion, the owning Service's label), its ports' names and
    numbers, and of each endpoint its first address and ready and terminating conditions
    (`_ready_urls`); not its managedFields, targetRefs, nodes, zones or hints."""
    metadata = obj.get("metadata") or {}
    owner = (metadata.get("labels") or {}).get(SERVICE_NAME_LABEL)
    endpoints = []
    for endpoint in obj.get("endpoints") or []:
        conditions = endpoint.get("conditions") or {}
        endpoints.append({
            "addresses": list(endpoint.get("addresses") or [])[:1],
            "conditions": {k: conditions[k] for k in ("ready", "terminating") if k in conditions},
        })  # fmt: skip
    return {
        "metadata": {
            **{k: metadata[k] for k in ("namespace", "name", "resourceVersion") if k in metadata},
            "labels": {SERVICE_NAME_LABEL: owner} if owner else {},
        },
        "ports": [{"name": p.get("name"), "port": p.get("port")} for p in obj.get("ports") or []],
        "endpoints": endpoints,
    }


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
        if kept is None or not _same(kept[0], slices):
            kept = (slices, Pool(role, _ready_urls(slices)))
        self._next_pools[key] = kept
        return kept[1]

    def service(self, obj: Mapping[str, Any], pools: tuple[Pool, ...]) -> Service | None:
        """The Service built before from the same `obj` and `pools`; None if there is none."""
        metadata = obj["metadata"]
        key = (metadata["namespace"], metadata["name"])
        kept = self._services.get(key)
        if kept is None or kept[0] is not obj or not _same(kept[1], pools):
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


def _same(before: Sequence[object], now: Sequence[object]) -> bool:
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

    found: dict[str, Service] = {}
    # The first claimant of a model name gets it (`claims.claim_order`), in every replica.
    for obj in sorted(services, key=claim_order):
        metadata = obj["metadata"]
        namespace, name = metadata["namespace"], metadata["name"]
        if metadata.get("deletionTimestamp"):
            continue
        spec = specs.parse(obj)
        if isinstance(spec, str):
            said.append(f"skipping {namespace}/{name}: {spec}")
            continue

        pool = functools.partial(_pool, by_service, built, namespace, name)
        pools: dict[Role, Pool] = {
            cast(Role, role): pool(cast(Role, role)) for role in spec.pools()
        }
        pools = _while_switching(pools, pool)
        model = spec.served_name
        if model in found:
            first = found[model]
            said.append(f"model {model!r} is served by {first.namespace}/{first.name} and "
                        f"{namespace}/{name}; routing to the first created")  # fmt: skip
            continue
        status = obj.get("status") or {}
        canary = _canary_pools(namespace, name, tuple(pools), status.get("canary"), by_service,
                               built=built)  # fmt: skip
        used = (*pools.values(), *(canary[1].values() if canary else ()))
        kept = built.service(obj, used)
        if kept is None:
            stable = Service(
                model=model, namespace=namespace, name=name, pools=pools,
                traffic=spec.traffic, slo=spec.slo, max_model_len=spec.model.max_model_len,
                revision=str(status.get("revision") or ""),
            )  # fmt: skip
            kept = built.keep(obj, used, _with_canary(stable, canary))
        found[model] = kept
    built.done()
    return found


CANARY_PHASES = (CanaryPhase.PROGRESSING, CanaryPhase.PAUSED, CanaryPhase.PROMOTING)
"""Phases in which a canary takes its share of the traffic (`status.canary.weight`)."""


def _canary_pools(
    namespace: str,
    name: str,
    roles: tuple[Role, ...],
    canary: Mapping[str, Any] | None,
    by_service: Mapping[tuple[str, str], list[Mapping[str, Any]]],
    *,
    built: Built,
) -> tuple[str, dict[Role, Pool], int] | None:
    """The canary its status publishes, if one runs: its revision, its pools (the Services the
    operator names after its revision, `labels.revision_child_name`, whose EndpointSlices list
    the canary pods that serve its share) and its weight."""
    if not canary or canary.get("phase") not in CANARY_PHASES or not canary.get("revision"):
        return None
    revision = str(canary["revision"])
    pools = {}
    for role in roles:
        child = L.revision_child_name(name, role, revision)
        pools[role] = built.pool(by_service.get((namespace, child), []), namespace, child, role)
    return revision, pools, int(canary.get("weight") or 0)


def _with_canary(stable: Service, canary: tuple[str, dict[Role, Pool], int] | None) -> Service:
    """`stable` with its canary's share (`_canary_pools`), if one runs."""
    if canary is None:
        return stable
    revision, pools, weight = canary
    service = replace(stable, pools=pools, revision=revision)
    return replace(stable, canary=Split.of(service, weight))


def _pool(
    by_service: Mapping[tuple[str, str], list[Mapping[str, Any]]],
    built: Built,
    namespace: str,
    name: str,
    role: Role,
) -> Pool:
    """Pool `role` of InferenceService `namespace/name` with its ready endpoints."""
    pool_service = L.pool_service_name(name, role)
    return built.pool(by_service.get((namespace, pool_service), []), namespace, pool_service, role)


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


def kubernetes_lister(
    kubeconfig: str | None = None, namespace: str | None = None, sync_timeout: float = 30.0
) -> Lister:
    """InferenceServices and llmfleet EndpointSlices from two informers (a LIST, then a WATCH
    resumed from its resourceVersion, `llmfleet.core.informer`): each call reads memory, no
    request. The first call waits (up to `sync_timeout`) for both first LISTs."""
    from kubernetes import client  # noqa: PLC0415 - only this source needs the client

    from llmfleet.core.kube import api_client  # noqa: PLC0415

    api = api_client(kubeconfig, component="gateway")
    custom, discovery = client.CustomObjectsApi(api), client.DiscoveryV1Api(api)
    selector = f"{L.MANAGED_BY}={L.MANAGED_BY_VALUE}"
    if namespace:
        services = functools.partial(
            custom.list_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL
        )
        slices = functools.partial(
            discovery.list_namespaced_endpoint_slice, namespace, label_selector=selector
        )
    else:
        services = functools.partial(custom.list_cluster_custom_object, GROUP, VERSION, PLURAL)
        slices = functools.partial(
            discovery.list_endpoint_slice_for_all_namespaces, label_selector=selector
        )
    changes = Changes()
    informers = [
        client_informer(what, api, call, on_change=changes, transform=keep)
        for what, call, keep in (
            ("inferenceservices", services, kept_service),
            ("endpointslices", slices, kept_slice),
        )
    ]
    return WatchedLister(informers, sync_timeout, changes)


class Changes:
    """The informers' `on_change` (called from their threads): counts the changes and wakes
    whoever waits for one (`KubeDiscovery`, on its event loop)."""

    def __init__(self) -> None:
        self.count = 0
        self._wake: Callable[[], None] | None = None

    def __call__(self, obj: Mapping[str, Any], before: Mapping[str, Any] | None) -> None:
        self.count += 1
        wake = self._wake
        if wake is not None:
            wake()

    def on_wake(self, wake: Callable[[], None] | None) -> None:
        self._wake = wake


class WatchedLister:
    """A `Lister` over informers (started here): each call reads their memory; `changes`
    counts what their watches saw; `stop` ends their watches (`KubeDiscovery.stop` calls it)."""

    def __init__(
        self, informers: list[Informer], sync_timeout: float, changes: Changes | None = None
    ) -> None:
        self._informers = informers
        self._sync_timeout = sync_timeout
        self.changes = changes if changes is not None else Changes()
        for informer in informers:
            informer.start()

    def __call__(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        for informer in self._informers:
            if not informer.wait_synced(self._sync_timeout):
                raise TimeoutError(f"no first LIST of {informer.what} in "
                                   f"{self._sync_timeout:.0f}s")  # fmt: skip
        found, endpoint_slices = (informer.items() for informer in self._informers)
        return cast(list[dict[str, Any]], found), cast(list[dict[str, Any]], endpoint_slices)

    def stop(self) -> None:
        for informer in self._informers:
            informer.stop()


@dataclass(frozen=True)
class _Discovered:
    services: dict[str, Service]
    by_name: dict[tuple[str, str], Service]
    problems: list[str]
    changes: list[str]


class KubeDiscovery:
    """The `Discovery` protocol over the Kubernetes API, rebuilt when the watches see a change
    (a lister without `changes`: every `interval` seconds)."""

    def __init__(self, lister: Lister, interval: float = 1.0) -> None:
        self._lister = lister
        self._interval = interval
        self._services: Mapping[str, Service] = {}
        self._by_name: Mapping[tuple[str, str], Service] = {}
        self._ready = False
        self._task: asyncio.Task[None] | None = None
        self._specs = Specs()
        self._built = Built()
        self._problems: set[str] = set()
        self.refreshes = 0
        """Snapshots built so far (tests count them)."""

    def _discover(self) -> _Discovered:
        """One list and snapshot, its index and what changed since the current one: in a
        worker thread, so that parsing and comparing stay off the event loop."""
        services, slices = self._lister()
        problems: list[str] = []
        found = snapshot(services, slices, problems, self._specs, self._built)
        self._specs.keep_only({(o["metadata"]["namespace"], o["metadata"]["name"])
                               for o in services})  # fmt: skip
        # `self._services` changes only on the loop, after this returns (one refresh at a time)
        return _Discovered(found, index_by_name(found), problems, changes(self._services, found))

    async def refresh(self) -> None:
        discovered = await asyncio.to_thread(self._discover)
        for line in discovered.changes:
            log.info("%s", line)
        # A problem is said when it appears and when it ends, not on every pass.
        problems = set(discovered.problems)
        for line in sorted(problems - self._problems):
            log.warning("%s", line)
        for line in sorted(self._problems - problems):
            log.info("resolved: %s", line)
        self._problems = problems
        self._services, self._by_name = discovered.services, discovered.by_name
        self._ready = True
        self.refreshes += 1

    async def _loop(self) -> None:
        changes: Changes | None = getattr(self._lister, "changes", None)
        woken = asyncio.Event()
        if changes is not None:
            loop = asyncio.get_running_loop()

            def wake() -> None:  # from an informer's thread; none once the loop has closed
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(woken.set)

            changes.on_wake(wake)
        try:
            while True:
                seen = changes.count if changes is not None else None
                failed = False
                try:
                    await self.refresh()
                except Exception as error:  # keep serving the last snapshot; say why once per pass
                    log.warning("discovery refresh failed, keeping the last snapshot: %s", error)
                    failed = True
                if changes is None or failed:
                    await asyncio.sleep(self._interval)
                    continue
                # A change during the refresh has moved the count: rebuild at once. The wait's
                # timeout only re-reads the count, in case a wake-up was lost.
                while changes.count == seen:
                    woken.clear()
                    if changes.count != seen:
                        break
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(woken.wait(), timeout=self._interval)
                await asyncio.sleep(SETTLE_SECONDS)
        finally:
            if changes is not None:
                changes.on_wake(None)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        # The loop waits in `wait_for`, which can swallow one cancel (`core/tasks.py`).
        await cancel_and_wait(self._task)
        stop = getattr(self._lister, "stop", None)
        if stop is not None:
            stop()  # a WatchedLister's watches end at once (`Informer.stop`)

    def services(self) -> Mapping[str, Service]:
        return self._services

    def by_name(self, namespace: str, name: str) -> Service | None:
        return self._by_name.get((namespace, name))

    def ready(self) -> bool:
        return self._ready
