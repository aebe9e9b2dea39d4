"""Warm-spare assignment as a table: who serves, who waits, how many pods the pool runs."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from llmfleet.operator.observed import ObservedPod
from llmfleet.operator.pools import COST_DRAINING, COST_SERVING, COST_SPARE, assign

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
DRAIN = 60.0


def pod(
    name: str,
    *,
    ready: bool = True,
    serving: bool = False,
    age: int = 100,
    demoted: int | None = None,
    in_flight: int | None = None,
) -> ObservedPod:  # fmt: skip
    return ObservedPod(
        name=name, pool="unified", created=NOW - timedelta(seconds=age), ready=ready,
        serving=serving, in_flight=in_flight,
        demoted_at=NOW - timedelta(seconds=demoted) if demoted is not None else None,
        deletion_cost=COST_SERVING if serving else None,
    )  # fmt: skip


@dataclass(frozen=True)
class Row:
    id: str
    pods: list[ObservedPod]
    active: int
    spares: int
    replicas: int
    serving: set[str]
    promoted: tuple[str, ...] = ()
    demoted: tuple[str, ...] = ()


ROWS = [
    Row("new-pool-nothing-ready", [pod("a", ready=False), pod("b", ready=False)], 2, 0, 2, set()),
    Row("ready-pods-promoted-oldest-first",
        [pod("young", age=5), pod("old", age=50), pod("mid", age=20)], 2, 1, 3,
        {"old", "mid"}, promoted=("old", "mid")),
    Row("steady-state-no-change", [pod("a", serving=True), pod("b")], 1, 1, 2, {"a"}),
    Row("scale-up-promotes-the-spare", [pod("a", serving=True), pod("b")], 2, 1, 3,
        {"a", "b"}, promoted=("b",)),
    Row("scale-down-demotes-youngest-and-keeps-it-draining",
        [pod("a", serving=True, age=90), pod("b", serving=True, age=10), pod("s")], 1, 1, 3,
        {"a"}, demoted=("b",)),
    Row("draining-pod-is-not-promoted-again",
        [pod("a", serving=True), pod("d", demoted=10)], 2, 0, 3, {"a"}),
    Row("drained-by-idle-engine-becomes-a-spare",
        [pod("a", serving=True), pod("d", demoted=10, in_flight=0)], 1, 1, 2, {"a"}),
    Row("drained-by-deadline-becomes-a-spare",
        [pod("a", serving=True), pod("d", demoted=61, in_flight=3)], 1, 1, 2, {"a"}),
    Row("unready-serving-pod-keeps-label-but-a-spare-covers",
        [pod("a", serving=True, ready=False), pod("b")], 1, 1, 2, {"a", "b"}, promoted=("b",)),
    Row("zero-replicas-demotes-everyone",
        [pod("a", serving=True)], 0, 0, 1, set(), demoted=("a",)),
]  # fmt: skip


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.id)
def test_assignment(row: Row) -> None:
    result = assign(row.pods, row.active, row.spares, NOW, DRAIN)
    assert result.replicas == row.replicas
    assert result.promoted == row.promoted
    assert result.demoted == row.demoted
    final = {p.name: p.serving for p in row.pods} | {c.name: c.serving for c in result.changes}
    assert {name for name, serving in final.items() if serving} == row.serving


def test_deletion_costs_make_spares_go_first() -> None:
    pods = [pod("a", serving=True, age=90), pod("b", serving=True, age=10), pod("s")]
    result = assign(pods, 1, 0, NOW, DRAIN)
    costs = {change.name: change.deletion_cost for change in result.changes}
    assert costs == {"b": COST_DRAINING}  # a keeps COST_SERVING, s keeps the default (spare)
    assert COST_SPARE < COST_DRAINING < COST_SERVING
    demoted = next(change for change in result.changes if change.name == "b")
    assert demoted.demoted_at == NOW
