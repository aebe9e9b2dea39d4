"""What a pass reads of its service (`watched.newest`): the watch's copy, unless the operator's
own last status write returned a newer one; nothing to compare, a GET instead."""

from __future__ import annotations

from typing import Any

import pytest

from llmfleet.operator.watched import newest


def at(version: str) -> dict[str, Any]:
    return {"metadata": {"name": "svc", "namespace": "ns", "resourceVersion": version}}


CACHED, WRITTEN = at("100"), at("105")


@pytest.mark.parametrize(
    ("cached", "written", "expected"),
    [
        pytest.param(CACHED, None, CACHED, id="no-write-the-watch"),
        pytest.param(CACHED, WRITTEN, WRITTEN, id="the-watch-behind-my-write"),
        pytest.param(at("105"), WRITTEN, "cached", id="the-watch-caught-up"),
        pytest.param(at("110"), WRITTEN, "cached", id="the-watch-ahead-of-my-write"),
        pytest.param(None, WRITTEN, None, id="not-in-the-cache-get-it"),
        pytest.param(at("abc"), WRITTEN, None, id="versions-not-numbers-get-it"),
    ],
)  # fmt: skip
def test_a_pass_reads_the_newest_it_knows(
    cached: dict[str, Any] | None, written: dict[str, Any] | None, expected: object
) -> None:
    found = newest(cached, written)
    assert found is (cached if expected == "cached" else expected)
