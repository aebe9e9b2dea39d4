"""The shared informer (`llmfleet.core.informer`): a LIST, then a WATCH resumed from the last
resourceVersion; a new LIST only on 410 Gone or a failure."""

from __future__ import annotations

import functools
import gc
import json
import threading
import time
import weakref
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from kubernetes import client

from llmfleet.core.informer import (
    Gone,
    Informer,
    Key,
    apply_event,
    client_informer,
    client_lister,
    newest,
    paged,
)
from tests.net import require_isolation, wait_for


def obj(name: str, version: str, **extra: Any) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name, "resourceVersion": version}, **extra}


@pytest.mark.parametrize(
    ("event", "after", "version"),
    [
        pytest.param({"type": "ADDED", "object": obj("b", "5")}, {"a", "b"}, "5", id="added"),
        pytest.param({"type": "MODIFIED", "object": obj("a", "6", spec=1)}, {"a"}, "6",
                     id="modified"),
        pytest.param({"type": "DELETED", "object": obj("a", "7")}, set(), "7", id="deleted"),
        pytest.param({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}},
                     {"a"}, "9", id="bookmark-moves-the-version-only"),
    ],
)  # fmt: skip
def test_apply_event(event: dict[str, Any], after: set[str], version: str) -> None:
    objects: dict[Key, Mapping[str, Any]] = {("ns", "a"): obj("a", "1")}
    assert apply_event(objects, event) == version
    assert {name for _, name in objects} == after


@pytest.mark.parametrize(
    ("cached", "written", "read"),
    [
        pytest.param("5", "7", "written", id="the-write-is-newer"),
        pytest.param("7", "7", "cached", id="the-watch-brought-the-write"),
        pytest.param("9", "7", "cached", id="the-watch-brought-a-later-change"),
        pytest.param("5", None, "cached", id="nothing-written"),
        pytest.param(None, "7", None, id="nothing-cached"),
        pytest.param("5", "x7", None, id="versions-that-are-not-numbers"),
    ],
)  # fmt: skip
def test_newest_reads_your_own_write_until_the_watch_brings_it(
    cached: str | None, written: str | None, read: str | None
) -> None:
    objects = {
        "cached": obj("a", cached) if cached else None,
        "written": obj("a", written) if written else None,
    }
    chosen = newest(objects["cached"], objects["written"])
    assert chosen is (objects[read] if read else None)


def test_a_410_error_event_is_gone() -> None:
    with pytest.raises(Gone):
        apply_event({}, {"type": "ERROR", "object": {"code": 410, "message": "too old"}})


class FakeServer:
    """Serves a LIST and scripted watches; records the versions each watch started from."""

    def __init__(self, watches: list[list[dict[str, Any]]]) -> None:
        self.watches = watches
        self.started: list[str] = []
        self.listed_at: list[float] = []
        self.done = threading.Event()

    def list(self) -> Mapping[str, Any]:
        self.listed_at.append(time.monotonic())
        return {"metadata": {"resourceVersion": "10"}, "items": [obj("a", "10")]}

    def watch(self, version: str) -> Iterator[Mapping[str, Any]]:
        self.started.append(version)
        if not self.watches:
            self.done.set()
            time.sleep(0.05)
            return
        yield from self.watches.pop(0)


def test_a_watch_resumes_from_its_last_version_and_relists_only_on_gone() -> None:
    server = FakeServer([
        [{"type": "ADDED", "object": obj("b", "11")}],  # the server ends this watch
        [{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "15"}}}],
        [{"type": "ERROR", "object": {"code": 410, "message": "too old"}}],
        [{"type": "DELETED", "object": obj("a", "12")}],
    ])  # fmt: skip
    informer = Informer("things", server.list, server.watch, retry_seconds=0.01)
    assert informer.synced_at is None
    informer.start()
    try:
        assert server.done.wait(10), "the scripted watches were not all consumed"
    finally:
        informer.stop()
    assert server.started[:4] == ["10", "11", "15", "10"]  # after the 410: LIST (at 10) again
    assert informer.lists == 2
    # Stamped when the first LIST was in memory; the LIST after the 410 leaves it.
    first, second = server.listed_at
    assert informer.synced_at is not None
    assert first <= informer.synced_at < second
    assert [item["metadata"]["name"] for item in informer.items()] == []


def labelled(name: str, version: str, service: str | None) -> dict[str, Any]:
    labels = {"llmfleet.dev/service": service} if service else {}
    return {"metadata": {"namespace": "ns", "name": name, "resourceVersion": version,
                         "labels": labels}}  # fmt: skip


def service_of(item: Mapping[str, Any]) -> Key | None:
    service = item["metadata"]["labels"].get("llmfleet.dev/service")
    return (item["metadata"]["namespace"], service) if service else None


class IndexServer:
    """A LIST of two pods of service `a`, then one scripted watch; a second watch (after the
    server ended the first) finds a 410, and the LIST after it shows `relisted`."""

    def __init__(self, events: list[dict[str, Any]], relisted: list[dict[str, Any]]) -> None:
        self.events, self.relisted = events, relisted
        self.listed = 0
        self.done = threading.Event()

    def list(self) -> Mapping[str, Any]:
        self.listed += 1
        items = [labelled("p1", "1", "a"), labelled("p2", "2", "a")]
        return {"metadata": {"resourceVersion": "2"},
                "items": items if self.listed == 1 else self.relisted}  # fmt: skip

    def watch(self, version: str) -> Iterator[Mapping[str, Any]]:
        if self.listed == 1 and self.events:
            events, self.events = self.events, []
            yield from events
            yield {"type": "ERROR", "object": {"code": 410, "message": "too old"}}
        self.done.set()
        time.sleep(0.05)


def test_the_index_follows_adds_deletes_and_label_changes_and_each_change_is_told() -> None:
    server = IndexServer(
        [
            {"type": "ADDED", "object": labelled("p3", "3", "b")},
            {"type": "MODIFIED", "object": labelled("p1", "4", "b")},  # relabelled a -> b
            {"type": "DELETED", "object": labelled("p2", "5", "a")},
            {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "6"}}},
        ],
        relisted=[labelled("p1", "4", "b"), labelled("p4", "7", None)],  # p3 gone, p4 new
    )
    told: list[tuple[str, str]] = []
    informer = Informer(
        "pods", server.list, server.watch, retry_seconds=0.01, index=service_of,
        on_change=lambda item, before: told.append(
            (item["metadata"]["name"], item["metadata"]["resourceVersion"],
             before["metadata"]["resourceVersion"] if before else None)),
    )  # fmt: skip
    informer.start()
    try:
        assert server.done.wait(10), "the scripted watches were not all consumed"
    finally:
        informer.stop()

    def names(service: str) -> list[str]:
        return sorted(item["metadata"]["name"] for item in informer.indexed(("ns", service)))

    assert (names("a"), names("b")) == ([], ["p1"])
    assert sorted(item["metadata"]["name"] for item in informer.items()) == ["p1", "p4"]
    # Each event once (bookmarks are no change), then what the LIST after the 410 changed.
    # Each with the version the cache held before (a deleted object as last seen).
    assert told[:3] == [("p3", "3", None), ("p1", "4", "1"), ("p2", "5", "2")]
    assert sorted(told[3:]) == [("p3", "3", "3"), ("p4", "7", None)]


def trimmed(item: Mapping[str, Any]) -> Mapping[str, Any]:
    """A transform: the object without its `spec`, marked as kept."""
    return {**{key: value for key, value in item.items() if key != "spec"}, "kept": True}


def whole(name: str, version: str, service: str | None) -> dict[str, Any]:
    return {**labelled(name, version, service), "spec": {"big": name * 100}}


def test_the_transform_is_applied_to_every_listed_and_watched_object_before_anyone_sees_it() -> (
    None
):
    server = IndexServer(
        [
            {"type": "ADDED", "object": whole("p3", "3", "b")},
            {"type": "MODIFIED", "object": whole("p1", "4", "b")},
            {"type": "DELETED", "object": whole("p2", "5", "a")},
            {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "6"}}},
        ],
        relisted=[whole("p1", "8", "b"), whole("p4", "7", None)],
    )
    server_list = server.list
    sent: list[Mapping[str, Any]] = []

    def listed() -> Mapping[str, Any]:
        listing = dict(server_list())
        listing["items"] = [whole(i["metadata"]["name"], i["metadata"]["resourceVersion"],
                                  i["metadata"]["labels"].get("llmfleet.dev/service"))
                            for i in listing["items"]]  # fmt: skip
        sent.extend(listing["items"])
        return listing

    told: list[tuple[Mapping[str, Any], Mapping[str, Any] | None]] = []
    informer = Informer("pods", listed, server.watch, retry_seconds=0.01, index=service_of,
                        on_change=lambda item, before: told.append((item, before)),
                        transform=trimmed)  # fmt: skip
    informer.start()
    try:
        assert server.done.wait(10), "the scripted watches were not all consumed"
    finally:
        informer.stop()

    # The cache and its index, after a LIST, a watch (add, change, delete) and a LIST again.
    cached = informer.items()
    assert sorted(item["metadata"]["name"] for item in cached) == ["p1", "p4"]
    indexed = informer.indexed(("ns", "b"))
    assert [item["metadata"]["resourceVersion"] for item in indexed] == ["8"]
    # Each told object (and the one the cache held before it) is kept, deleted ones too.
    assert len(told) == 6  # three events, then the LIST: p1 changed, p3 gone, p4 new
    seen = [*cached, *indexed, *(item for pair in told for item in pair if item is not None)]
    assert all(item.get("kept") is True and "spec" not in item for item in seen)
    # The objects as the server sent them are not changed.
    assert sent
    assert all("spec" in item and "kept" not in item for item in sent)


def test_client_informer_passes_the_transform_on() -> None:
    informer = client_informer("pods", client.ApiClient(), lambda **_: None, transform=trimmed)
    assert informer._transform is trimmed


class IdleApiServer(BaseHTTPRequestHandler):
    """A pods endpoint on 127.0.0.1: a LIST of none, and a watch that sends its headers and
    then nothing (an idle watch) until the client goes or the test ends."""

    watching = threading.Event()
    finished = threading.Event()

    def do_GET(self) -> None:
        if "watch=true" not in self.path.lower():
            body = json.dumps({"kind": "PodList", "apiVersion": "v1", "items": [],
                               "metadata": {"resourceVersion": "1"}}).encode()  # fmt: skip
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        type(self).watching.set()
        type(self).finished.wait(STOP_SECONDS * 2)

    def log_message(self, *args: Any) -> None:
        pass


STOP_SECONDS = 10
"""Deadline for a stopped informer's thread to end; its idle watch would otherwise wait for
the server's `WATCH_SECONDS` (240)."""


def _served(handler: type[BaseHTTPRequestHandler]) -> tuple[ThreadingHTTPServer, Any]:
    """`handler` served on a free 127.0.0.1 port (inside the test's namespace), and a
    Kubernetes API client pointed at it; the caller shuts the server down."""
    require_isolation()
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{server.server_address[1]}"
    return server, client.ApiClient(configuration)


def test_stop_ends_an_idle_watch_at_once() -> None:
    server, api = _served(IdleApiServer)
    informer = client_informer(
        "pods", api, functools.partial(client.CoreV1Api(api).list_namespaced_pod, "ns")
    )
    informer.start()
    try:
        assert informer.wait_synced(STOP_SECONDS), "no first LIST"
        assert IdleApiServer.watching.wait(STOP_SECONDS), "no watch opened"
        informer.stop()
        assert informer.join(STOP_SECONDS), "stop() left the idle watch open"
    finally:
        IdleApiServer.finished.set()
        server.shutdown()
        server.server_close()


class Held(dict[str, Any]):
    """An object whose lifetime a test can follow (a weak reference)."""


def test_a_paged_list_is_read_a_page_at_a_time_and_lets_each_page_go() -> None:
    pages = {
        None: ({"resourceVersion": "30", "continue": "b"}, ["p1", "p2"]),
        "b": ({"resourceVersion": "30", "continue": "c"}, ["p3", "p4"]),
        "c": ({"resourceVersion": "30"}, ["p5"]),
    }
    sent: list[weakref.ref[Held]] = []
    fetched: list[tuple[str | None, int]] = []

    def page(token: str | None) -> Mapping[str, Any]:
        alive = sum(1 for ref in sent if ref() is not None)
        fetched.append((token, alive))
        metadata, names = pages[token]
        items = [Held(obj(name, "30", spec="x" * 100)) for name in names]
        sent.extend(weakref.ref(item) for item in items)
        return {"metadata": metadata, "items": items}

    informer = Informer("pods", lambda: paged(page), lambda version: iter(()),
                        transform=trimmed)  # fmt: skip
    assert informer._relist() == "30"
    assert sorted(item["metadata"]["name"] for item in informer.items()) == [
        "p1", "p2", "p3", "p4", "p5"]  # fmt: skip
    # Each page fetched once the one before was read, with no whole object of the pages
    # before that one still alive (the cache holds the transformed ones).
    assert fetched == [(None, 0), ("b", 2), ("c", 2)]
    assert all(ref() is None for ref in sent)


class PagedApiServer(BaseHTTPRequestHandler):
    """A pods LIST on 127.0.0.1 served two objects a page, as the `limit` and `continue` of
    each request ask; records the queries."""

    queries: list[dict[str, list[str]]] = []

    def do_GET(self) -> None:
        query = parse_qs(urlsplit(self.path).query)
        type(self).queries.append(query)
        start = int(query.get("continue", ["0"])[0])
        limit = int(query["limit"][0])
        names = [f"p{n}" for n in range(5)][start : start + limit]
        metadata = {"resourceVersion": "9"}
        if start + limit < 5:
            metadata["continue"] = str(start + limit)
        body = json.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": metadata,
                           "items": [obj(name, "9") for name in names]}).encode()  # fmt: skip
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_the_client_lister_asks_for_pages() -> None:
    server, api = _served(PagedApiServer)
    try:
        lister = client_lister(
            api, functools.partial(client.CoreV1Api(api).list_namespaced_pod, "ns"), page_size=2
        )
        listing = lister()
        names = [item["metadata"]["name"] for item in listing["items"]]
    finally:
        server.shutdown()
        server.server_close()
    assert names == ["p0", "p1", "p2", "p3", "p4"]
    assert listing["metadata"]["resourceVersion"] == "9"
    asked = [(q["limit"], q.get("continue")) for q in PagedApiServer.queries]
    assert asked == [(["2"], None), (["2"], ["2"]), (["2"], ["4"])]


def test_the_collector_is_paused_while_a_list_is_read_and_only_then() -> None:
    """A LIST's JSON holds no cycles; collections set off by its objects walked the heap for
    nothing (`core.gc_paused`). The collector is off from the LIST's request to its last item
    kept, and on again after, for the watch."""
    seen: list[tuple[str, bool]] = []
    done = threading.Event()

    def lister() -> Mapping[str, Any]:
        seen.append(("request", gc.isenabled()))

        def items() -> Iterator[Mapping[str, Any]]:
            for name in ("a", "b"):
                seen.append((f"item {name}", gc.isenabled()))
                yield obj(name, "1")

        return {"metadata": {"resourceVersion": "1"}, "items": items()}

    def transform(item: Mapping[str, Any]) -> Mapping[str, Any]:
        seen.append(("kept", gc.isenabled()))
        return item

    def watcher(version: str) -> Iterator[Mapping[str, Any]]:
        seen.append(("watch", gc.isenabled()))
        done.wait(5)
        yield from ()

    assert gc.isenabled()
    informer = Informer("things", lister, watcher, transform=transform)
    informer.start()
    try:
        assert informer.wait_synced(STOP_SECONDS), "no first LIST"
        wait_for(lambda: True if ("watch", True) in seen else None, STOP_SECONDS,
                 "the watch after the LIST")  # fmt: skip
    finally:
        informer.stop()
        done.set()
    assert seen[:6] == [("request", False), ("item a", False), ("kept", False),
                        ("item b", False), ("kept", False), ("watch", True)]  # fmt: skip
    assert gc.isenabled()
