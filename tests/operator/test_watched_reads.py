"""What a pass reads of pods and children (`Watched.of`), over informers fed by a fake server:
the watch's objects, and the operator's own write of one until the watch brings it (or its
deletion), so a pass does not apply again what the watch has not shown yet."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kubernetes import client

from llmfleet.core.informer import Informer
from llmfleet.crds import labels as L
from llmfleet.operator.kube import PLURALS
from llmfleet.operator.watched import POD, Watched

CONFIG_MAP = ("v1", "ConfigMap")
DEADLINE = 10.0


def obj(kind: str, name: str, version: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": kind,
            "metadata": {"namespace": "ns", "name": name, "resourceVersion": version,
                         "labels": {L.SERVICE: "svc", **labels}}}  # fmt: skip


class FakeServer:
    """A LIST of `listed` per plural, then the events put on its queue, one watch at a time."""

    def __init__(self, listed: Mapping[str, list[dict[str, Any]]]) -> None:
        self.listed = listed
        self.events: dict[str, queue.Queue[dict[str, Any]]] = {}
        self.stopped = threading.Event()

    def informer(self, what: str, **options: Any) -> Informer:
        events = self.events.setdefault(what, queue.Queue())

        def watch(version: str) -> Iterator[Mapping[str, Any]]:
            while not self.stopped.is_set():
                try:
                    yield events.get(timeout=0.05)
                except queue.Empty:
                    return

        items = list(self.listed.get(what, []))
        listing = {"metadata": {"resourceVersion": "1"}, "items": items}
        options.pop("call")
        return Informer(what, lambda: listing, watch, **options)


def wait(check: Callable[[], bool], what: str) -> None:
    done = threading.Event()
    for _ in range(int(DEADLINE / 0.02)):
        if check():
            return
        done.wait(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def names(watched: Watched, kind: tuple[str, str]) -> list[tuple[str, str, str]]:
    return sorted(
        (o["metadata"]["name"], o["metadata"]["resourceVersion"],
         o["metadata"]["labels"].get(L.SERVING, ""))
        for o in watched.of(kind, "ns", "svc")
    )  # fmt: skip


def test_own_writes_are_read_until_the_watch_brings_them_or_their_deletion() -> None:
    server = FakeServer({"pods": [obj("Pod", "p1", "10", **{L.SERVING: "false"})]})
    watched = Watched(client.ApiClient(), ["ns"], PLURALS, informer=server.informer)
    watched.start([CONFIG_MAP])
    try:
        watched.wait_synced([CONFIG_MAP], DEADLINE)
        assert names(watched, POD) == [("p1", "10", "false")]

        # A promotion applied, and a ConfigMap created, that the watch has not shown yet.
        watched.wrote(POD, obj("Pod", "p1", "12", **{L.SERVING: "true"}))
        watched.wrote(CONFIG_MAP, obj("ConfigMap", "runtime", "13"))
        assert names(watched, POD) == [("p1", "12", "true")]
        assert names(watched, CONFIG_MAP) == [("runtime", "13", "")]

        # The watch brings both, then someone deletes the ConfigMap.
        server.events["pods"].put(
            {"type": "MODIFIED", "object": obj("Pod", "p1", "14", **{L.SERVING: "true"})}
        )
        server.events["configmaps"].put(
            {"type": "ADDED", "object": obj("ConfigMap", "runtime", "13")}
        )
        wait(lambda: names(watched, POD) == [("p1", "14", "true")], "the watched pod")
        server.events["configmaps"].put(
            {"type": "DELETED", "object": obj("ConfigMap", "runtime", "15")}
        )
        wait(lambda: names(watched, CONFIG_MAP) == [], "the ConfigMap's deletion")
    finally:
        server.stopped.set()
        watched.stop()
