"""Pruning (pure): the children the spec no longer wants are deleted, serving pods drained first.

Only what is the service's own twice over may go: its controller owner reference is this
InferenceService (by uid) and it carries the operator's labels (`llmfleet.dev/service: <name>`
and `app.kubernetes.io/managed-by: llmfleet-operator`). A look-alike by name or labels, or an
object the service owns that the operator did not label, is never touched.

A pool the spec no longer has (a topology change) is retired make-before-break: its pods keep
serving until every pool of the spec serves its target (or the spec's pools cannot get GPUs,
which the old pool may be holding); then they are demoted and drained as a scale-down drains
them (`pools.assign` with a target of 0), and once none is draining its Deployment, Service and
PodDisruptionBudget are deleted (the Deployment takes its pods along). Any other unwanted child
(no pool, or a leftover of a pool the spec still has) is deleted at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from llmfleet.crds import InferenceService
from llmfleet.crds import labels as L
from llmfleet.operator.failures import ChildKey
from llmfleet.operator.observed import Observed, ObservedChild
from llmfleet.operator.pools import PoolAssignment, assign


def ours(child: ObservedChild, service: InferenceService) -> bool:
    """Owned by the service (controller reference, same uid) and labelled by the operator."""
    return (
        child.controller_uid == service.metadata["uid"]
        and child.labels.get(L.SERVICE) == service.metadata["name"]
        and child.labels.get(L.MANAGED_BY) == L.MANAGED_BY_VALUE
    )


@dataclass(frozen=True)
class Pruning:
    deletions: tuple[ObservedChild, ...]
    """Children to delete now."""
    draining: dict[str, PoolAssignment]
    """Retired pools whose pods are being demoted and drained (their pod changes apply)."""
    waiting: tuple[str, ...]
    """Retired pools still serving until the spec's pools serve."""
    removed: tuple[str, ...]
    """Retired pools drained: their children are among `deletions`."""


def prune(
    service: InferenceService,
    observed: Observed,
    *,
    wanted: set[ChildKey],
    replacements_serve: bool,
    now: datetime,
    drain_seconds: float,
) -> Pruning:
    """What to delete of the service's observed children, given the keys of those it wants;
    `replacements_serve`: every pool of the spec serves (so a retired pool may drain)."""
    stale = [c for c in observed.children if ours(c, service) and c.key not in wanted]
    pools = service.spec.pools()
    retired = sorted({c.pool for c in stale if c.pool and c.pool not in pools})
    deletions = [c for c in stale if not c.pool or c.pool in pools]
    draining: dict[str, PoolAssignment] = {}
    waiting: list[str] = []
    removed: list[str] = []
    for pool in retired:
        if not replacements_serve:
            waiting.append(pool)
            continue
        assignment = assign(observed.pool_pods(pool), 0, 0, now, drain_seconds)
        if assignment.replicas > 0:  # pods still draining (or demoted just now)
            draining[pool] = assignment
        else:
            removed.append(pool)
            deletions += [c for c in stale if c.pool == pool]
    return Pruning(tuple(deletions), draining, tuple(waiting), tuple(removed))
