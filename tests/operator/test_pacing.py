"""When a service's loop runs a pass (`pacing.py`): woken, at its requeue, or at its full
resync; a resync period that ends with none of them runs nothing (the loop before issue 28
ran a pass at the end of every wait, so an idle operator's CPU grew with services x time)."""

from __future__ import annotations

import pytest

from llmfleet.operator.pacing import Pacing

RESYNC, FULL = 30.0, 300.0
PASSED = 1000.0
"""When the last pass ended (the event loop's clock)."""


def pacing(chance: float = 0.0) -> Pacing:
    """Drawn `chance` for the spread: 0 puts the full resync at half the period."""
    paced = Pacing(RESYNC, FULL, chance=lambda: chance)
    paced.ran(PASSED)
    return paced


@pytest.mark.parametrize(
    ("woken", "requeue", "after", "due"),
    [
        (True, None, 1.0, True),
        (True, None, RESYNC, True),
        (False, 2.0, 2.0, True),
        (True, 2.0, 0.5, True),
        (False, None, RESYNC, False),
        (False, None, FULL / 2 - 1, False),
        (False, None, FULL / 2, True),
        (False, None, FULL / 2 + RESYNC, True),
    ],
    ids=[
        "woken",
        "woken as the resync period ended",
        "requeue came",
        "woken before the requeue",
        "resync period, nothing changed: no pass",
        "just before the full resync: no pass",
        "full resync due",
        "full resync overdue",
    ],
)
def test_a_pass_runs_for_a_reason(
    woken: bool, requeue: float | None, after: float, due: bool
) -> None:
    assert pacing().due(woken=woken, requeue=requeue, now=PASSED + after) is due


@pytest.mark.parametrize(("requeue", "timeout"), [(None, RESYNC), (2.0, 2.0), (120.0, 120.0)])
def test_the_wait_lasts_until_the_requeue_or_the_next_look(
    requeue: float | None, timeout: float
) -> None:
    assert pacing().timeout(requeue) == timeout


@pytest.mark.parametrize(("chance", "due_after"), [(0.0, FULL / 2), (0.5, 0.75 * FULL),
                                                   (0.999, 0.9995 * FULL)])  # fmt: skip
def test_full_resyncs_are_spread_over_the_second_half_of_the_period(
    chance: float, due_after: float
) -> None:
    assert pacing(chance).full_due == pytest.approx(PASSED + due_after)


def test_any_pass_puts_the_full_resync_off() -> None:
    """A pass that a change ran compares everything a full resync would."""
    paced = pacing()
    later = PASSED + FULL / 2 - 1
    paced.ran(later)
    assert not paced.due(woken=False, requeue=None, now=later + FULL / 2 - 1)
    assert paced.due(woken=False, requeue=None, now=later + FULL / 2)
