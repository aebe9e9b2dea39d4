"""One kind's objects kept in memory by a LIST and then a WATCH (issue 28): readers get the
current objects without a request, and the API server sends only changes.

The watch resumes from the last resourceVersion it saw (bookmarks included) whenever the
server ends it; a 410 Gone (that version is no longer in the server's window) starts over
with a LIST, which replaces the cache. Any other failure is logged once per failure in a row
and retried after `retry_seconds`, the last objects still served.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

log = logging.getLogger("llmfleet.gateway.discovery")

Lister = Callable[[], Mapping[str, Any]]
"""LISTs the kind: the list object as JSON (`items`, `metadata.resourceVersion`)."""
Watcher = Callable[[str], Iterable[Mapping[str, Any]]]
"""WATCHes the kind from a resourceVersion: raw events (`type`, `object`) until the server
ends the watch; raises on an ERROR event (a status 410 for Gone)."""
Key = tuple[str, str]


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


class Informer:
    """Objects of one kind, kept current in a daemon thread (`start`; `stop` ends it at the
    next event or server timeout)."""

    def __init__(
        self, what: str, lister: Lister, watcher: Watcher, retry_seconds: float = 1.0
    ) -> None:
        self.what = what
        self._list, self._watch = lister, watcher
        self._retry = retry_seconds
        self._objects: dict[Key, Mapping[str, Any]] = {}
        self._lock = threading.Lock()
        self._synced = threading.Event()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"informer-{what}", daemon=True)
        self.lists = 0
        """LISTs sent (the first, then one per 410 or failure): what a test counts."""

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def wait_synced(self, timeout: float) -> bool:
        return self._synced.wait(timeout)

    def items(self) -> list[Mapping[str, Any]]:
        with self._lock:
            return list(self._objects.values())

    def _relist(self) -> str:
        listing = self._list()
        self.lists += 1
        fresh = {key_of(item): item for item in listing.get("items") or []}
        with self._lock:
            self._objects = fresh
        self._synced.set()
        return str((listing.get("metadata") or {}).get("resourceVersion") or "")

    def _run(self) -> None:
        version: str | None = None
        failures = 0
        while not self._stopped.is_set():
            try:
                if version is None:
                    version = self._relist()
                for event in self._watch(version):
                    with self._lock:
                        resumed = apply_event(self._objects, event)
                    version = resumed or version
                    if self._stopped.is_set():
                        return
                failures = 0
            except Gone:
                version = None  # the window moved on: LIST again
            except Exception as error:  # the API server away, a refusal: keep the last objects
                failures += 1
                if failures == 1:
                    log.warning("watch of %s failed, retrying every %.0fs: %s",
                                self.what, self._retry, error)  # fmt: skip
                version = None
                self._stopped.wait(self._retry)
