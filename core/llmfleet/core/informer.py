"""One kind's objects kept in memory by a LIST and then a WATCH (issue 28), shared by the
operator, the gateway and the autoscaler: readers get the current objects without a request,
and the API server sends only changes.

The watch resumes from the last resourceVersion it saw (bookmarks included) whenever the
server ends it; a 410 Gone (that version is no longer in the server's window) starts over
with a LIST, which replaces the cache. Any other failure is logged once per failure in a row
and retried after `retry_seconds`, the last objects still served.

An informer may keep an index (`index`: an object's key in it, None for none) and call
`on_change` with every object that an event or a LIST after the first changed (a deleted one
as last seen), and the object the cache held before (None for a new one), after the cache
holds the change: a reader woken by `on_change` sees it.

An informer may also `transform` each object before anything sees it (client-go's
`SetTransform`): the object of every LIST item and of every ADDED, MODIFIED and DELETED event
goes through it once, and the cache, the index and `on_change` hold only what it returns. A
component keeps that way only the fields it reads (the operator: `operator/kept.py`); the
transform must keep `metadata.namespace`, `name` and `resourceVersion`, which the informer
itself reads.

The client's LIST comes in pages (`PAGE_SIZE` objects each, `paged`), each page transformed
before the next is read: a LIST of 10,000 pods never holds them all whole at once.

`stop` ends the thread promptly, an idle watch included: it sets the stop flag and calls
`interrupt` (the client's watcher closes the open response's socket), so the blocked read
returns at once instead of at the next event or the server's timeout.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from typing import Any, cast

from llmfleet.core.gc_paused import collector_paused

log = logging.getLogger("llmfleet.informer")

Lister = Callable[[], Mapping[str, Any]]
"""LISTs the kind: the list object as JSON (`items`, `metadata.resourceVersion`); `items` may
be any iterable, read once (`paged`: the pages after the first are fetched as it is read)."""
Page = Callable[[str | None], Mapping[str, Any]]
"""Fetches one page of a LIST: the first for None, else the one a `metadata.continue` token
names."""
Watcher = Callable[[str], Iterable[Mapping[str, Any]]]
"""WATCHes the kind from a resourceVersion: raw events (`type`, `object`) until the server
ends the watch; raises on an ERROR event (a status 410 for Gone)."""
Key = tuple[str, str]
Index = Callable[[Mapping[str, Any]], Hashable | None]
"""An object's key in an informer's index; None: not indexed."""
OnChange = Callable[[Mapping[str, Any], Mapping[str, Any] | None], None]
"""Told (the object, the object as the cache held it before or None)."""
Transform = Callable[[Mapping[str, Any]], Mapping[str, Any]]
"""What of an object the informer keeps (a new object; the one given is not changed)."""
Interrupt = Callable[[], None]
"""Called by `stop` from another thread: ends the watch in progress (its iterator stops or
raises) and any later one at once."""

PAGE_SIZE = 500
"""Objects per page of a LIST (client-go's pager asks for as many)."""
WATCH_SECONDS = 240
"""How long the API server keeps one watch open before ending it (the informer resumes)."""


class Gone(Exception):
    """The watch's resourceVersion is too old: LIST again."""


def key_of(obj: Mapping[str, Any]) -> Key:
    metadata = obj["metadata"]
    return (metadata.get("namespace") or "", metadata["name"])


def apply_event(objects: dict[Key, Mapping[str, Any]], event: Mapping[str, Any]) -> str | None:
    """Apply one watch event to `objects` (pure but for the dict); the resourceVersion to
    resume from. Raises `Gone` for a 410 ERROR event."""
    kind, obj = event.get("type"), event.get("object") or {}
    if kind == "ERROR":
        if obj.get("code") == 410:
            raise Gone(str(obj.get("message") or "resourceVersion too old"))
        raise RuntimeError(f"watch error {obj.get('code')}: {obj.get('message')}")
    version = (obj.get("metadata") or {}).get("resourceVersion")
    if kind in ("ADDED", "MODIFIED"):
        objects[key_of(obj)] = obj
    elif kind == "DELETED":
        objects.pop(key_of(obj), None)
    return str(version) if version else None


def _version(obj: Mapping[str, Any] | None) -> object:
    return None if obj is None else (obj.get("metadata") or {}).get("resourceVersion")


def _number(obj: Mapping[str, Any]) -> int | None:
    text = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    return int(text) if text.isdigit() else None


def newest(
    cached: Mapping[str, Any] | None, written: Mapping[str, Any] | None
) -> Mapping[str, Any] | None:
    """Read-your-writes: `written` (what a component's own write returned) when it is newer
    than `cached` (what the watch has brought), else `cached`; None when there is nothing
    cached or the versions are not numbers to compare (the caller decides: a GET, or the
    cached object).

    NOTE: resourceVersions are opaque in the API's contract; the API server's are etcd's
    revision numbers, which only grow. Anything else is not compared."""
    if cached is None or written is None:
        return cached
    mine, seen = _number(written), _number(cached)
    if mine is None or seen is None:
        return None
    return written if mine > seen else cached


class Informer:
    """Objects of one kind, kept current in a daemon thread (`start`; `stop` ends it, at once
    with an `interrupt`, else at the watch's next event or the server's timeout)."""

    def __init__(
        self,
        what: str,
        lister: Lister,
        watcher: Watcher,
        retry_seconds: float = 1.0,
        *,
        index: Index | None = None,
        on_change: OnChange | None = None,
        interrupt: Interrupt | None = None,
        transform: Transform | None = None,
    ) -> None:
        self.what = what
        self._interrupt = interrupt
        self._list, self._watch = lister, watcher
        self._retry = retry_seconds
        self._index_of = index
        self._on_change = on_change
        self._transform = transform
        self._objects: dict[Key, Mapping[str, Any]] = {}
        self._index: dict[Hashable, dict[Key, Mapping[str, Any]]] = {}
        self._lock = threading.Lock()
        self._synced = threading.Event()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"informer-{what}", daemon=True)
        self.lists = 0
        """LISTs sent (the first, then one per 410 or failure): what a test counts."""
        self.synced_at: float | None = None
        """When the first LIST was in memory (`time.monotonic()`), None until then."""

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._interrupt is not None:
            self._interrupt()

    def join(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the thread to end (after `stop`); whether it has."""
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def wait_synced(self, timeout: float) -> bool:
        return self._synced.wait(timeout)

    def items(self) -> list[Mapping[str, Any]]:
        with self._lock:
            return list(self._objects.values())

    def get(self, key: Key) -> Mapping[str, Any] | None:
        """The object (namespace, name) as the cache holds it now; None when it holds none."""
        with self._lock:
            return self._objects.get(key)

    def indexed(self, key: Hashable) -> list[Mapping[str, Any]]:
        """The objects whose `index` is `key` (none without an index)."""
        with self._lock:
            return list(self._index.get(key, {}).values())

    def _reindex(self) -> None:
        """Rebuild the index from the objects (the lock held)."""
        self._index = {}
        if self._index_of is None:
            return
        for key, obj in self._objects.items():
            found = self._index_of(obj)
            if found is not None:
                self._index.setdefault(found, {})[key] = obj

    def _indexed_event(
        self, event: Mapping[str, Any]
    ) -> tuple[str | None, Mapping[str, Any] | None]:
        """`apply_event` with the index kept (the lock held); the version to resume from and
        the object the cache held before."""
        obj = event.get("object") or {}
        key = key_of(obj) if event.get("type") in ("ADDED", "MODIFIED", "DELETED") else None
        before = self._objects.get(key) if key is not None else None
        resumed = apply_event(self._objects, event)
        if key is not None and self._index_of is not None:
            if before is not None and (old := self._index_of(before)) is not None:
                self._index.get(old, {}).pop(key, None)
            after = self._objects.get(key)
            if after is not None and (new := self._index_of(after)) is not None:
                self._index.setdefault(new, {})[key] = after
        return resumed, before

    def _kept(self, event: Mapping[str, Any]) -> Mapping[str, Any]:
        """`event` with its object transformed (an object's event; not a BOOKMARK or ERROR)."""
        if self._transform is None or event.get("type") not in ("ADDED", "MODIFIED", "DELETED"):
            return event
        return {**event, "object": self._transform(event.get("object") or {})}

    def _relist(self) -> str:
        # The collector is paused while the LIST is read (`core.gc_paused`: the parsed JSON
        # holds no cycles, and collections set off by its objects walked the whole heap: ~9 s
        # of an operator's restart at 10,000 pods, ~1 s paused).
        with collector_paused():
            listing = self._list()
            self.lists += 1
            version = str((listing.get("metadata") or {}).get("resourceVersion") or "")
            keep = self._transform
            fresh = {
                key_of(item): keep(item) if keep else item for item in listing.get("items") or []
            }
            del listing  # the whole objects go now, not after the callbacks below
        with self._lock:
            old, self._objects = self._objects, fresh
            self._reindex()
        first = not self._synced.is_set()
        if first:
            self.synced_at = time.monotonic()
        self._synced.set()
        if self._on_change is not None and not first:
            # What changed while no watch ran: new, changed and vanished objects alike (the
            # first LIST tells nothing: readers wait for it, `wait_synced`).
            for key in old.keys() | fresh.keys():
                if _version(old.get(key)) != _version(fresh.get(key)):
                    self._on_change(fresh.get(key) or old[key], old.get(key))
        return version

    def _run(self) -> None:
        version: str | None = None
        failures = 0
        while not self._stopped.is_set():
            try:
                if version is None:
                    version = self._relist()
                for raw in self._watch(version):
                    event = self._kept(raw)
                    with self._lock:
                        resumed, before = self._indexed_event(event)
                    version = resumed or version
                    if self._on_change is not None and event.get("type") != "BOOKMARK":
                        self._on_change(event.get("object") or {}, before)
                    if self._stopped.is_set():
                        return
                failures = 0
            except Gone:
                version = None  # the window moved on: LIST again
            except Exception as error:  # the API server away, a refusal: keep the last objects
                if self._stopped.is_set():
                    return  # an interrupted watch ends in an error: no failure
                failures += 1
                if failures == 1:
                    log.warning("watch of %s failed, retrying every %.0fs: %s",
                                self.what, self._retry, error)  # fmt: skip
                version = None
                self._stopped.wait(self._retry)


# -- the Kubernetes client as a Lister and a Watcher ---------------------------------------------


def _checked(api: Any, response: Any) -> Any:
    """`response` when 2xx; else the client's ApiException for it."""
    status = getattr(response, "status", None)
    if isinstance(status, int) and not 200 <= status <= 299:
        api.response_deserialize(response, {})
    return response


def paged(page: Page) -> Mapping[str, Any]:
    """A LIST read page by page: the first page's metadata (its `resourceVersion` is the whole
    list's) and every page's items, a page fetched once the one before has been read; a page
    is let go as soon as the next is fetched. A continue token the API server no longer
    serves (410 after etcd's compaction) raises from the iteration: the informer then LISTs
    again."""
    first = page(None)

    def items(current: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
        while True:
            yield from current.get("items") or []
            token = (current.get("metadata") or {}).get("continue")
            if not token:
                return
            current = page(str(token))

    return {"metadata": first.get("metadata") or {}, "items": items(first)}


def client_lister(api: Any, call: Callable[..., Any], page_size: int = PAGE_SIZE) -> Lister:
    """`call` (a generated client's list method, its arguments bound) as a `Lister` of raw
    JSON, `page_size` objects a request (`paged`): no models are built for the objects."""

    def one_page(token: str | None) -> Mapping[str, Any]:
        more = {"_continue": token} if token else {}
        response = _checked(api, call(limit=page_size, _preload_content=False, **more))
        try:
            return cast(Mapping[str, Any], json.loads(response.data))
        finally:
            response.release_conn()

    return lambda: paged(one_page)


def _shut(response: Any) -> None:
    """End a streaming response from another thread: shut its socket down (a blocked read
    returns at once; closing the file alone does not wake it)."""
    sock = getattr(getattr(response, "connection", None), "sock", None)
    try:
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
        else:
            response.close()
    except OSError:
        pass  # closed already


class ClientWatcher:
    """`call` (as `client_lister`) as a `Watcher`: a watch with bookmarks, ended by the server
    after `WATCH_SECONDS`, or at once by `interrupt` (then no watch opens again)."""

    def __init__(self, api: Any, call: Callable[..., Any]) -> None:
        self._api, self._call = api, call
        self._lock = threading.Lock()
        self._open: Any = None
        self._interrupted = False

    def __call__(self, version: str) -> Iterator[Mapping[str, Any]]:
        from kubernetes.watch.watch import iter_resp_lines  # noqa: PLC0415

        response = _checked(self._api, self._call(
            watch=True, resource_version=version, allow_watch_bookmarks=True,
            timeout_seconds=WATCH_SECONDS, _preload_content=False,
            _request_timeout=(10, WATCH_SECONDS + 30),
        ))  # fmt: skip
        with self._lock:
            interrupted = self._interrupted
            self._open = None if interrupted else response
        try:
            if interrupted:
                return
            for line in iter_resp_lines(response):  # type: ignore[no-untyped-call]
                if line.strip():
                    yield cast(Mapping[str, Any], json.loads(line))
        finally:
            with self._lock:
                self._open = None
            response.close()
            response.release_conn()

    def interrupt(self) -> None:
        with self._lock:
            self._interrupted = True
            response = self._open
        if response is not None:
            _shut(response)


def client_watcher(api: Any, call: Callable[..., Any]) -> ClientWatcher:
    """`call` (as `client_lister`) as a `Watcher` (`ClientWatcher`)."""
    return ClientWatcher(api, call)


def client_informer(
    what: str,
    api: Any,
    call: Callable[..., Any],
    *,
    index: Index | None = None,
    on_change: OnChange | None = None,
    transform: Transform | None = None,
) -> Informer:
    """An informer over a generated client's list method (not started); `stop` ends its watch
    at once."""
    watcher = ClientWatcher(api, call)
    return Informer(what, client_lister(api, call), watcher, index=index,
                    on_change=on_change, interrupt=watcher.interrupt,
                    transform=transform)  # fmt: skip
