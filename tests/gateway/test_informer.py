"""The informer (`informer.py`): a LIST, then a WATCH resumed from the last resourceVersion; a
new LIST only on 410 Gone or a failure."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from llmfleet.gateway.informer import Gone, Informer, Key, apply_event


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


def test_a_410_error_event_is_gone() -> None:
    with pytest.raises(Gone):
        apply_event({}, {"type": "ERROR", "object": {"code": 410, "message": "too old"}})


class FakeServer:
    """Serves a LIST and scripted watches; records the versions each watch started from."""

    def __init__(self, watches: list[list[dict[str, Any]]]) -> None:
        self.watches = watches
        self.started: list[str] = []
        self.done = threading.Event()

    def list(self) -> Mapping[str, Any]:
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
    informer.start()
    try:
        assert server.done.wait(10), "the scripted watches were not all consumed"
    finally:
        informer.stop()
    assert server.started[:4] == ["10", "11", "15", "10"]  # after the 410: LIST (at 10) again
    assert informer.lists == 2
    assert [item["metadata"]["name"] for item in informer.items()] == []
