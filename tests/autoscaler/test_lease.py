"""The autoscaler's leader election rule as a table (issue 27: two replicas, one acting)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from llmfleet.autoscaler.lease import Held, Step, decide

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


def held(holder: str, ago: float | None, duration: float = 60) -> Held:
    return Held(holder, None if ago is None else NOW - timedelta(seconds=ago), duration)


@pytest.mark.parametrize(
    ("lease", "step"),
    [
        (None, Step.CREATE),
        (held("me", 10), Step.RENEW),
        (held("me", 600), Step.RENEW),
        (held("other", 10), Step.FOLLOW),
        (held("other", 60), Step.FOLLOW),
        (held("other", 61), Step.TAKE_OVER),
        (held("", 1), Step.TAKE_OVER),
        (held("other", None), Step.TAKE_OVER),
    ],
    ids=["no lease", "ours", "ours, late", "theirs, fresh", "theirs, at its end",
         "theirs, expired", "released", "never renewed"],
)  # fmt: skip
def test_decide(lease: Held | None, step: Step) -> None:
    assert decide(lease, "me", NOW) is step
