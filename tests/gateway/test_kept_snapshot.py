"""`KeptSnapshot`: discovery rebuilding only what a change touched gives the snapshot built from
every object, and `KubeDiscovery` over real informers rebuilds only that."""

from __future__ import annotations

import asyncio
import functools
import queue
from collections.abc import Iterator, Mapping
from typing import Any

from llmfleet.core.informer import Informer
from llmfleet.gateway.discovery import index_by_name
from llmfleet.gateway.from_objects import changes, snapshot
from llmfleet.gateway.kept_snapshot import KeptSnapshot, Key
from llmfleet.gateway.kube_discovery import (
    Changes,
    KubeDiscovery,
    WatchedLister,
    kept_service,
    kept_slice,
    pool_of_slice,
)
from tests.gateway.test_kube_discovery import (
    UNIFIED,
    _fleet,
    endpoint_slice,
    random_walk,
    service,
    until,
)


def _slices(by_pool: dict[Key, list[Mapping[str, Any]]], key: Key) -> list[Mapping[str, Any]]:
    return by_pool.get(key, [])


def _key(obj: Mapping[str, Any]) -> Key:
    return obj["metadata"]["namespace"], obj["metadata"]["name"]


def test_what_a_change_touched_rebuilt_is_the_snapshot_from_every_object() -> None:
    """Through a random walk, each update told only what the informers would tell (the
    services whose object is new or gone, the pool Services of slices new or gone) gives the
    snapshot, index, problems and change lines of a snapshot built from every object."""
    kept = KeptSnapshot()
    before_services: dict[Key, Mapping[str, Any]] = {}
    before_slices: list[Mapping[str, Any]] = []
    before_whole: dict[str, Any] = {}
    rebuilt = 0
    for step, (services, slices) in random_walk(11, 300):
        now = {_key(obj): obj for obj in services}
        told = {key for key in now.keys() | before_services.keys()
                if now.get(key) is not before_services.get(key)}  # fmt: skip
        old_ids, new_ids = {id(s) for s in before_slices}, {id(s) for s in slices}
        moved = [s for s in slices if id(s) not in old_ids]
        moved += [s for s in before_slices if id(s) not in new_ids]
        pools = {key for s in moved if (key := pool_of_slice(s)) is not None}
        by_pool: dict[Key, list[Mapping[str, Any]]] = {}
        for s in slices:
            if (key := pool_of_slice(s)) is not None:
                by_pool.setdefault(key, []).append(s)

        update = kept.update(told, pools, now.get, functools.partial(_slices, by_pool))
        problems: list[str] = []
        whole = snapshot(services, slices, problems)
        assert update.services == whole, step
        assert update.by_name == index_by_name(whole), step
        assert sorted(update.problems) == sorted(problems), step
        assert changes(update.before, update.after) == changes(before_whole, whole), step
        rebuilt += len(update.after)
        before_services, before_slices, before_whole = now, list(slices), whole
    # each step rebuilt its few touched models, not the fleet of 12
    assert rebuilt < 300 * 3, rebuilt


def test_a_change_to_one_pool_rebuilds_that_service_alone() -> None:
    services, slices = _fleet(50)
    kept = KeptSnapshot()
    by_key = {_key(obj): obj for obj in services}
    by_pool = {pool_of_slice(s): [s] for s in slices}
    first = kept.update(by_key, (), by_key.get, lambda key: by_pool.get(key, []))
    assert len(first.services) == 50
    by_pool["ns", "s7-unified"] = [endpoint_slice("s7-unified", ("10.0.7.0", True, False))]
    second = kept.update((), [("ns", "s7-unified")], by_key.get, lambda k: by_pool.get(k, []))
    assert [m for m in second.services if second.services[m] is not first.services[m]] == ["m7"]
    assert list(second.after) == ["m7"]
    assert second.services["m7"].pools["unified"].endpoints == ("http://10.0.7.0:8000",)
    assert first.services["m7"].pools["unified"].endpoints != ("http://10.0.7.0:8000",)
    # the first snapshot is left as readers hold it
    assert second.services is not first.services
    # nothing told, nothing rebuilt
    third = kept.update((), (), by_key.get, lambda k: by_pool.get(k, []))
    assert third.after == {}
    assert third.services == second.services


def test_changes_note_the_keys_each_event_touched() -> None:
    changes_ = Changes()
    assert changes_.take().everything  # at first, everything is to be built
    changes_.service(service("a", UNIFIED), None)
    moved = endpoint_slice("b-unified", ("10.0.0.1", True, False))
    was = endpoint_slice("c-unified", ("10.0.0.1", True, False))
    changes_.endpoint_slice(moved, was)  # its label moved from c's pool to b's
    taken = changes_.take()
    assert (taken.services, taken.pools, taken.everything) == (
        {("ns", "a")}, {("ns", "b-unified"), ("ns", "c-unified")}, False
    )  # fmt: skip
    assert changes_.count == 2
    empty = changes_.take()
    assert (empty.services, empty.pools, empty.everything) == (set(), set(), False)
    changes_.put_back(taken)  # a failed rebuild: the next take has it again
    assert changes_.take().services == {("ns", "a")}
    changes_(service("a", UNIFIED), None)  # of no known kind
    assert changes_.take().everything


class QueueServer:
    """A LIST of `items`, then a WATCH that yields what is put in `events` (None ends it)."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()

    def list(self) -> Mapping[str, Any]:
        return {"metadata": {"resourceVersion": "1"}, "items": self.items}

    def watch(self, version: str) -> Iterator[Mapping[str, Any]]:
        while (event := self.events.get()) is not None:
            yield event


def _versioned(obj: dict[str, Any], version: int) -> dict[str, Any]:
    """`obj` as the API server sends it: with a resourceVersion, and a name (a slice is named
    after its Service here, one slice each)."""
    metadata = obj["metadata"]
    metadata["resourceVersion"] = str(version)
    metadata.setdefault("name", (metadata.get("labels") or {}).get("kubernetes.io/service-name"))
    return obj


def test_discovery_over_informers_rebuilds_what_their_events_touched() -> None:
    services, slices = _fleet(20)
    service_server = QueueServer([_versioned(s, 1) for s in services])
    slice_server = QueueServer([_versioned(s, 1) for s in slices])
    changes_ = Changes()
    informers = [
        Informer("inferenceservices", service_server.list, service_server.watch,
                 on_change=changes_.service, transform=kept_service),
        Informer("endpointslices", slice_server.list, slice_server.watch,
                 on_change=changes_.endpoint_slice, transform=kept_slice, index=pool_of_slice),
    ]  # fmt: skip
    lister = WatchedLister(informers, sync_timeout=10, changes=changes_)
    discovery = KubeDiscovery(lister, interval=3600)  # only the informers' events rebuild it

    async def scenario() -> None:
        await discovery.start()
        await until(lambda: len(discovery.services()) == 20, "the first snapshot")
        first = discovery.services()
        # one pool's slice: two of its three endpoints go unready
        endpoints = [
            ("10.0.3.0", True, False),
            ("10.0.3.1", False, False),
            ("10.0.3.2", False, False),
        ]
        changed = endpoint_slice("s3-unified", *endpoints)
        slice_server.events.put({"type": "MODIFIED", "object": _versioned(changed, 2)})
        await until(lambda: len(discovery.services()["m3"].pools["unified"].endpoints) == 1,
                    "the change routed")  # fmt: skip
        second = discovery.services()
        assert [m for m in second if second[m] is not first[m]] == ["m3"]
        # a service deleted: its model is gone, the others untouched
        gone = _versioned(service("s5", UNIFIED), 3)
        service_server.events.put({"type": "DELETED", "object": gone})
        await until(lambda: "m5" not in discovery.services(), "the deletion routed")
        third = discovery.services()
        assert all(third[m] is second[m] for m in third)
        assert discovery.by_name("ns", "s5") is None
        assert discovery.by_name("ns", "s3") is third["m3"]
        await discovery.stop()

    try:
        asyncio.run(scenario())
    finally:
        for informer in informers:
            informer.stop()
        for server in (service_server, slice_server):
            server.events.put(None)  # ends the watch; the stopped informer does not resume
        assert all(informer.join(5) for informer in informers)
