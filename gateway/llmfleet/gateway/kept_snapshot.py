"""The discovery snapshot kept current by what changed (issue 28): after one event, the work is
that event's service, not the fleet's.

`from_objects.snapshot` builds every service from every object, which at 1,000 services cost
~10 ms of a worker thread per change (the GIL held meanwhile). `KeptSnapshot` keeps what each
InferenceService was built into (`_Entry`: its object, model name, `Service` or what is wrong
with its spec, and the pool Services it looked up) and, told which services and which pool
Services changed (`update`), rebuilds only the services those touch, then settles only the
model names whose claimants changed. Its result is the snapshot `snapshot` would build from the
same objects (tests/gateway/test_kept_snapshot.py walks both through random changes), through
the same per-service code (`service_pools`, `service_of`).

Where the objects come from is the caller's: `service(key)` returns the InferenceService
(namespace, name) as the informer holds it now (None once deleted), `slices(key)` the
EndpointSlices of pool Service (namespace, name). A key reported changed after the objects were
read is rebuilt again at the next update; reading an object newer than its report is harmless.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from llmfleet.crds.claims import claim_order
from llmfleet.gateway.discovery import Pool, Role, Service
from llmfleet.gateway.from_objects import (
    Specs,
    conflict_line,
    invalid_line,
    ready_urls,
    same_objects,
    service_of,
    service_pools,
)

ROLES: tuple[Role, ...] = ("unified", "prefill", "decode")
Key = tuple[str, str]
"""(namespace, name) of an InferenceService or of a pool's Service."""


@dataclass
class _Entry:
    obj: Mapping[str, Any]
    model: str | None
    """The model name it claims; None for an invalid spec (it claims none)."""
    service: Service | None
    problem: str | None
    pools: set[Key] = field(default_factory=set)
    """The pool Services it looked up, found or not: a slice of any of them rebuilds it."""


@dataclass(frozen=True)
class Update:
    services: dict[str, Service]
    """Model name -> Service: a new dict (the previous one is left as readers hold it)."""
    by_name: dict[Key, Service]
    problems: list[str]
    before: dict[str, Service]
    """The previous Service of each model name this update touched (for `changes`)."""
    after: dict[str, Service]
    """The new Service of each model name this update touched."""


class KeptSnapshot:
    def __init__(self, specs: Specs | None = None) -> None:
        self._specs = specs or Specs()
        self._entries: dict[Key, _Entry] = {}
        self._claimants: dict[str, set[Key]] = {}
        self._owners: dict[Key, set[Key]] = {}
        self._pools: dict[tuple[str, str, Role], tuple[Sequence[Mapping[str, Any]], Pool]] = {}
        self._found: dict[str, Service] = {}
        self._by_name: dict[Key, Service] = {}
        self._invalid: dict[Key, str] = {}
        self._conflicts: dict[str, list[str]] = {}

    def keys(self) -> set[Key]:
        """The services built so far (a full rebuild also visits these, to drop the gone)."""
        return set(self._entries)

    def update(
        self,
        services: Iterable[Key],
        pools: Iterable[Key],
        service: Callable[[Key], Mapping[str, Any] | None],
        slices: Callable[[Key], Sequence[Mapping[str, Any]]],
    ) -> Update:
        """Rebuild the `services` that changed and those that looked up one of the `pools`
        that changed, from `service` and `slices`; settle their model names."""
        touched = set(services)
        for key in pools:
            touched |= self._owners.get(key, set())
        models: set[str] = set()
        for key in touched:
            old = self._entries.pop(key, None)
            if old is not None:
                self._unlink(key, old, models)
            obj = service(key)
            if obj is None or obj["metadata"].get("deletionTimestamp"):
                if obj is None:
                    self._specs.forget(key)
                continue
            entry = self._build(obj, slices)
            self._entries[key] = entry
            self._link(key, entry, models)
        return self._settle(models)

    def _build(
        self, obj: Mapping[str, Any], slices: Callable[[Key], Sequence[Mapping[str, Any]]]
    ) -> _Entry:
        metadata = obj["metadata"]
        spec = self._specs.parse(obj)
        if isinstance(spec, str):
            return _Entry(obj, None, None, invalid_line(metadata["namespace"], metadata["name"],
                                                         spec))  # fmt: skip
        looked_up: set[Key] = set()

        def pool_of(namespace: str, pool_service: str, role: Role) -> Pool:
            key = (namespace, pool_service)
            looked_up.add(key)
            now = slices(key)
            kept = self._pools.get((namespace, pool_service, role))
            if kept is None or not same_objects(kept[0], now):
                kept = (now, Pool(role, ready_urls(now)))
                self._pools[namespace, pool_service, role] = kept
            return kept[1]

        pools, canary = service_pools(obj, spec, pool_of)
        built = service_of(obj, spec, pools, canary)
        return _Entry(obj, spec.served_name, built, None, looked_up)

    def _link(self, key: Key, entry: _Entry, models: set[str]) -> None:
        for pool in entry.pools:
            self._owners.setdefault(pool, set()).add(key)
        if entry.problem is not None:
            self._invalid[key] = entry.problem
        if entry.model is not None:
            self._claimants.setdefault(entry.model, set()).add(key)
            models.add(entry.model)

    def _unlink(self, key: Key, entry: _Entry, models: set[str]) -> None:
        for pool in entry.pools:
            owners = self._owners.get(pool)
            if owners is not None:
                owners.discard(key)
                if not owners:
                    del self._owners[pool]
                    for role in ROLES:
                        self._pools.pop((pool[0], pool[1], role), None)
        self._invalid.pop(key, None)
        if entry.model is not None:
            claimants = self._claimants.get(entry.model)
            if claimants is not None:
                claimants.discard(key)
                if not claimants:
                    del self._claimants[entry.model]
            models.add(entry.model)

    def _settle(self, models: set[str]) -> Update:
        """Each touched model name to its first claimant (`claims.claim_order`), the others
        said as conflicts; the new snapshot and its index as copies with those changes."""
        found, by_name = dict(self._found), dict(self._by_name)
        before: dict[str, Service] = {}
        after: dict[str, Service] = {}
        for model in models:
            old = found.pop(model, None)
            if old is not None:
                before[model] = old
                if by_name.get((old.namespace, old.name)) is old:
                    del by_name[old.namespace, old.name]
            self._conflicts.pop(model, None)
            claimants = sorted(self._claimants.get(model, ()),
                               key=lambda k: claim_order(self._entries[k].obj))  # fmt: skip
            if not claimants:
                continue
            first = self._entries[claimants[0]].service
            assert first is not None  # a claimant's spec is valid
            found[model] = after[model] = by_name[first.namespace, first.name] = first
            if len(claimants) > 1:
                self._conflicts[model] = [conflict_line(model, first, *key)
                                          for key in claimants[1:]]  # fmt: skip
        self._found, self._by_name = found, by_name
        conflicts = (line for lines in self._conflicts.values() for line in lines)
        problems = [*self._invalid.values(), *conflicts]
        return Update(found, by_name, problems, before, after)
