"""Discovery from the Kubernetes API: InferenceServices and their pools' EndpointSlices.

The operator's pool Services select only serving pods, so Kubernetes' own EndpointSlices list
exactly the endpoints that may receive new requests: a promoted spare appears, a demoted pod
disappears, without the gateway knowing about spares at all.

`kubernetes_lister` keeps both kinds in memory (only the fields discovery reads: `kept_service`,
`kept_slice`) by watches (`llmfleet.core.informer`: a LIST, then a WATCH resumed from its
resourceVersion, a new LIST on 410 Gone), the EndpointSlices indexed by their Service, and
notes which services and which pool Services each event touched (`Changes`). `KubeDiscovery`
is woken by those notes and, after `SETTLE_SECONDS` so that a burst of events makes one
rebuild, rebuilds in a worker thread only the services they touched
(`kept_snapshot.KeptSnapshot`: a change costs its service, not the fleet), diffs what changed
for the log, and swaps the new snapshot in one assignment, so `services()` stays a cheap read
on every request. With nothing changed nothing is rebuilt, so an idle fleet costs no work
however large. A lister without `changes` (a static one, in tests) is re-read whole every
`interval` seconds (`from_objects.snapshot`). A conflict (two services claiming one model name)
or an invalid spec is logged when it appears and when it ends, not on every pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from llmfleet.core.informer import Informer, client_informer
from llmfleet.core.tasks import cancel_and_wait
from llmfleet.crds import GROUP, PLURAL, VERSION
from llmfleet.crds import labels as L
from llmfleet.gateway.discovery import Service, index_by_name
from llmfleet.gateway.from_objects import SERVICE_NAME_LABEL, Built, Specs, changes, snapshot
from llmfleet.gateway.kept_snapshot import KeptSnapshot, Key

log = logging.getLogger("llmfleet.gateway.discovery")
SETTLE_SECONDS = 0.05
"""How long a woken discovery waits for more events before it rebuilds (one rebuild per burst)."""

Lister = Callable[[], tuple[list[dict[str, Any]], list[dict[str, Any]]]]
"""Returns (InferenceService objects, EndpointSlice objects) as plain dicts."""


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
    (`ready_urls`); not its managedFields, targetRefs, nodes, zones or hints."""
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
        client_informer("inferenceservices", api, services, on_change=changes.service,
                        transform=kept_service),
        client_informer("endpointslices", api, slices, on_change=changes.endpoint_slice,
                        transform=kept_slice, index=pool_of_slice),
    ]  # fmt: skip
    return WatchedLister(informers, sync_timeout, changes)


def pool_of_slice(obj: Mapping[str, Any]) -> Key | None:
    """(namespace, name) of the Service an EndpointSlice belongs to; None for none."""
    metadata = obj.get("metadata") or {}
    owner = (metadata.get("labels") or {}).get(SERVICE_NAME_LABEL)
    return (str(metadata.get("namespace") or ""), str(owner)) if owner else None


@dataclass
class Dirty:
    """What changed since the last `Changes.take`: services and pool Services by (namespace,
    name); `everything` when a change is not known by its key (all is rebuilt)."""

    services: set[Key]
    pools: set[Key]
    everything: bool


class Changes:
    """The informers' `on_change` (called from their threads): notes which services and pool
    Services each event touched, counts the changes and wakes whoever waits for one
    (`KubeDiscovery`, on its event loop). Called as itself, for a change of no known kind,
    it has everything rebuilt."""

    def __init__(self) -> None:
        self.count = 0
        self._wake: Callable[[], None] | None = None
        self._lock = threading.Lock()
        self._dirty = Dirty(set(), set(), everything=True)

    def __call__(self, obj: Mapping[str, Any], before: Mapping[str, Any] | None) -> None:
        with self._lock:
            self._dirty.everything = True
        self._changed()

    def service(self, obj: Mapping[str, Any], before: Mapping[str, Any] | None) -> None:
        metadata = obj.get("metadata") or {}
        with self._lock:
            self._dirty.services.add((str(metadata.get("namespace")), str(metadata.get("name"))))
        self._changed()

    def endpoint_slice(self, obj: Mapping[str, Any], before: Mapping[str, Any] | None) -> None:
        # its Service as it is and as it was (a slice's label may name another one now)
        keys = {pool_of_slice(obj), pool_of_slice(before) if before is not None else None}
        with self._lock:
            self._dirty.pools |= {key for key in keys if key is not None}
        self._changed()

    def take(self) -> Dirty:
        """What changed since the last take (everything, at first)."""
        with self._lock:
            taken, self._dirty = self._dirty, Dirty(set(), set(), everything=False)
        return taken

    def put_back(self, dirty: Dirty) -> None:
        """A taken change not acted on (the rebuild failed): the next take has it again."""
        with self._lock:
            self._dirty.services |= dirty.services
            self._dirty.pools |= dirty.pools
            self._dirty.everything |= dirty.everything

    def _changed(self) -> None:
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
        self.wait_synced()
        found, endpoint_slices = (informer.items() for informer in self._informers)
        return cast(list[dict[str, Any]], found), cast(list[dict[str, Any]], endpoint_slices)

    def wait_synced(self) -> None:
        """Wait (up to the sync timeout) for every informer's first LIST; TimeoutError after."""
        for informer in self._informers:
            if not informer.wait_synced(self._sync_timeout):
                raise TimeoutError(f"no first LIST of {informer.what} in "
                                   f"{self._sync_timeout:.0f}s")  # fmt: skip

    def service_keys(self) -> set[Key]:
        return {(o["metadata"]["namespace"], o["metadata"]["name"])
                for o in self._informers[0].items()}  # fmt: skip

    def service(self, key: Key) -> Mapping[str, Any] | None:
        """The InferenceService (namespace, name) as its informer holds it; None for none."""
        return self._informers[0].get(key)

    def slices(self, key: Key) -> Sequence[Mapping[str, Any]]:
        """The EndpointSlices of Service (namespace, name), from the informer's index."""
        return self._informers[1].indexed(key)

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
        self._kept = KeptSnapshot(self._specs)
        self._problems: set[str] = set()
        self.refreshes = 0
        """Snapshots built so far (tests count them)."""

    def _discover(self) -> _Discovered:
        """The new snapshot, its index and what changed since the current one: in a worker
        thread, so that parsing and comparing stay off the event loop. From a watched lister,
        only what its changes touched is rebuilt; any other is listed and rebuilt whole."""
        if isinstance(self._lister, WatchedLister):
            return self._discover_changed(self._lister)
        services, slices = self._lister()
        problems: list[str] = []
        found = snapshot(services, slices, problems, self._specs, self._built)
        self._specs.keep_only({(o["metadata"]["namespace"], o["metadata"]["name"])
                               for o in services})  # fmt: skip
        # `self._services` changes only on the loop, after this returns (one refresh at a time)
        return _Discovered(found, index_by_name(found), problems, changes(self._services, found))

    def _discover_changed(self, lister: WatchedLister) -> _Discovered:
        lister.wait_synced()
        dirty = lister.changes.take()
        try:
            touched = dirty.services
            if dirty.everything:  # every service listed now, and those built before (gone?)
                touched = lister.service_keys() | self._kept.keys()
            update = self._kept.update(touched, dirty.pools, lister.service, lister.slices)
        except Exception:
            lister.changes.put_back(dirty)
            raise
        said = changes(update.before, update.after)
        return _Discovered(update.services, update.by_name, update.problems, said)

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
