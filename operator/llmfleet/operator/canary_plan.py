"""Canary rollouts in the plan (pure): which Deployments run per pool in the rollout's state,
their targets within the GPU budget, their pods' serving labels, and the rollout's status.

Per pool:
- the stable revision's Deployment: `<service>-<pool>`, or `<service>-<p><6 hex>` once a canary
  was promoted (`status.stableSpec.deploymentRevision`); rendered from `status.stableSpec`
  while the spec asks for another revision, else from the spec (so a service that never ran a
  canary renders exactly as before);
- a running canary's Deployment and Service, `<service>-<p><6 hex of its revision>`: its pods
  serve as `llmfleet.dev/serving: canary`, which only its own Service selects (the gateway
  sends the canary's share there). Sized for its share, ceil(active x weight / 100), at least
  one pod, no spares (the stable revision keeps them); while promoting, the whole target;
- Deployments of a revision that no longer runs (the old stable after a promotion, a canary
  after a rollback, abort, cancel or a newer spec): not applied any more; their pods are
  demoted and drained as a scale-down drains them, after the pods that take over were given
  their labels; pruning deletes them once none is draining.

Promotion takes one pass once the canary serves the whole target: its pods turn `"true"` (the
pool Service selects them), the old revision's pods are demoted, and `status.revision` names
the canary, whose Deployment is the stable one from then on.

NOTE: a canary's Deployment is named by its revision's first six hex digits. If they are the
first six of the revision the stable Deployments are named after (2^-24 per rollout), the two
share a name and the canary's template replaces the stable's: the pool rolls in place, as
with RollingUpdate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime

from llmfleet.crds import Condition, InferenceService
from llmfleet.crds import labels as L
from llmfleet.crds.inference_service import (
    CanaryPhase,
    CanaryStatus,
    ConditionStatus,
    StableSpec,
)
from llmfleet.operator import children
from llmfleet.operator.budget import PoolTarget
from llmfleet.operator.failures import ChildKey
from llmfleet.operator.observed import Observed, ObservedChild, ObservedPod
from llmfleet.operator.pools import PodChange, PoolAssignment, assign
from llmfleet.operator.prune import ours
from llmfleet.operator.rollout import (
    Actions,
    Decision,
    Event,
    RolloutInput,
    active,
    decide,
    revision,
    stable_spec,
)
from llmfleet.operator.settings import OperatorSettings

STABLE, CANARY, RETIRING = "stable", "canary", "retiring"


@dataclass(frozen=True)
class Track:
    """One Deployment of one pool and what it runs."""

    pool: str
    name: str
    revision: str
    role: str
    """stable, canary or retiring."""
    assignment: PoolAssignment
    view: InferenceService | None = None
    """The service as this revision's pods see it (None for a retiring Deployment)."""
    target: PoolTarget | None = None


@dataclass(frozen=True)
class RolloutPlan:
    decision: Decision
    spec_revision: str
    stable_spec: StableSpec
    tracks: tuple[Track, ...]
    stable_targets: dict[str, PoolTarget]
    configs: dict[str, str]
    """ConfigMap key -> runtime config, for every Deployment that runs (and retiring ones)."""
    keep: frozenset[ChildKey]
    """Deployments of retiring revisions whose pods still drain: pruning must wait."""
    events: tuple[Event, ...]

    def role(self, role: str) -> list[Track]:
        return [track for track in self.tracks if track.role == role]

    @property
    def assignments(self) -> dict[str, PoolAssignment]:
        """The stable revision's assignment per pool (what Ready and status.pools describe)."""
        return {track.pool: track.assignment for track in self.role(STABLE)}

    @property
    def settling(self) -> bool:
        """A canary's pods start or a retiring revision's pods drain: look again soon."""
        return bool(self.role(RETIRING)) or any(
            track.assignment.ready < track.assignment.total
            or track.assignment.serving < (track.target.active if track.target else 0)
            or track.assignment.changes
            for track in self.role(CANARY)
        )

    def children(
        self, service: InferenceService, settings: OperatorSettings, surge: int
    ) -> list[children.Manifest]:
        """Every running revision's Deployment per pool; the stable one's pool Service and
        PodDisruptionBudget (over both revisions' pods), a canary's own Service."""
        found: list[children.Manifest] = []
        for track in self.tracks:
            if track.view is None:
                continue  # a retiring revision: not applied any more, its pods drain
            found.append(children.deployment(
                track.view, track.pool, track.assignment.replicas, settings, surge,
                name=track.name, revision=track.revision,
            ))  # fmt: skip
            if track.role == CANARY:
                found.append(
                    children.canary_service(service, track.pool, track.name, track.revision)
                )
            else:
                found += [
                    children.pool_service(service, track.pool),
                    children.disruption_budget(service, track.pool),
                ]
        return found

    def pod_changes(self, draining: tuple[PoolAssignment, ...] = ()) -> tuple[PodChange, ...]:
        """Pods that take traffic over get their labels before retiring ones lose theirs, so
        a Service's endpoints never pass through empty (`draining`: pools pruning retires)."""
        running = [t.assignment for t in self.tracks if t.role != RETIRING]
        retiring = [t.assignment for t in self.tracks if t.role == RETIRING]
        return tuple(
            change
            for assignment in (*running, *draining, *retiring)
            for change in assignment.changes
        )

    def requeue(self, pools: float | None) -> float | None:
        """When to look again: the pools' wish (`pools`), sooner while a canary's pods start or
        a retiring revision drains, and at the rollout's next step or analysis."""
        waits = [w for w in (pools, self.decision.requeue_after) if w is not None]
        if self.settling:
            waits.append(2.0)
        return min(waits, default=None)

    def status(self) -> dict[str, object]:
        """`revision`, `stableSpec` and `canary` of the status patch. Every field is written
        (unset ones as null) so that the merge patch leaves nothing stale behind."""
        canary = self.decision.canary
        return {
            "revision": self.decision.stable_revision,
            "stableSpec": self.stable_spec.model_dump(by_alias=True, mode="json"),
            "canary": canary.model_dump(by_alias=True, mode="json") if canary else None,
        }

    def serving(self) -> str:
        """The canary's part of the Serving column, e.g. ` canary 1/1 (25%)`."""
        tracks = self.role(CANARY)
        canary = self.decision.canary
        if not tracks or canary is None:
            return ""
        counts = [
            (t.pool, t.assignment.serving, t.target.active if t.target else 0) for t in tracks
        ]
        pools = (
            f"{counts[0][1]}/{counts[0][2]}"
            if len(counts) == 1
            else " ".join(f"{pool} {serving}/{target}" for pool, serving, target in counts)
        )
        return f" canary {pools} ({canary.weight}%)"


def deployment_name(service: InferenceService, pool: str, named_after: str) -> str:
    """The Deployment of `pool` started for revision `named_after` ("" for the pool's own)."""
    if not named_after:
        return children.child_name(service, pool)
    return L.revision_child_name(str(service.metadata["name"]), pool, named_after)


def with_stable_spec(service: InferenceService, made_of: StableSpec) -> InferenceService:
    """`service` as the stable revision's pods see it: its model and runtime from `made_of`."""
    spec = service.spec.model_copy(update={"model": made_of.model, "runtime": made_of.runtime})
    return service.model_copy(update={"spec": spec})


def share(active: int, weight: int) -> int:
    """Canary pods for `weight` percent of a pool of `active` serving pods: at least one."""
    return 0 if active == 0 or weight == 0 else max(1, math.ceil(active * weight / 100))


def split(
    targets: Mapping[str, PoolTarget],
    weight: int,
    serving: Mapping[str, int],
    *,
    promoting: bool,
    gpus_per_pod: int,
    budget: int | None,
    held_elsewhere: int = 0,
) -> tuple[dict[str, PoolTarget], dict[str, PoolTarget]]:
    """Stable and canary targets per pool within the GPU budget.

    The canary gets its share of each pool's active pods (`share`; while promoting, the whole
    target, spares too); the stable revision keeps its target while the budget has room.
    Beyond it, in order: stable spares, canary spares; stable active pods down to what the
    canary does not serve for it yet, less one (`serving`: with no room to make before break,
    one pod at a time changes sides), but not below the stable side's own share; canary active
    down to one; stable active down to one (none once the canary takes all the traffic).
    `held_elsewhere`: pods of retiring pools or revisions."""
    stable = dict(targets)
    canary: dict[str, PoolTarget] = {}
    for pool, target in targets.items():
        count = target.active if promoting else share(target.active, weight)
        spares = target.spares if promoting else 0
        if count or spares:
            canary[pool] = PoolTarget(count, spares, "canary", count, spares)
    if budget is None or not canary:
        return stable, canary
    rest = 0 if promoting else 100 - weight
    own = {pool: math.ceil(t.active * rest / 100) for pool, t in targets.items()}

    def held() -> int:
        pods = sum(t.active + t.spares + t.draining for t in stable.values())
        pods += sum(t.active + t.spares for t in canary.values())
        return (pods + held_elsewhere) * gpus_per_pod

    def cut(side: dict[str, PoolTarget], field: str, floor: Mapping[str, int]) -> None:
        while held() > budget:
            room = {pool: getattr(t, field) - floor.get(pool, 0) for pool, t in side.items()}
            pool = max(room, key=lambda name: room[name], default=None)
            if pool is None or room[pool] <= 0:
                return
            side[pool] = replace(side[pool], **{field: getattr(side[pool], field) - 1})

    cut(stable, "spares", {})
    cut(canary, "spares", {})
    cut(stable, "active", {
        pool: max(own[pool], t.active - serving.get(pool, 0) - 1) for pool, t in stable.items()
    })  # fmt: skip
    cut(canary, "active", dict.fromkeys(canary, 1))
    cut(stable, "active", {pool: min(1, own[pool]) for pool in stable})
    return stable, canary


def _pods_of(
    observed: Observed, service: InferenceService, pool: str, name: str
) -> list[ObservedPod]:
    """The pods of the Deployment `name` of `pool` (pods without `llmfleet.dev/deployment`
    belong to the pool's own `<service>-<pool>`)."""
    own = children.child_name(service, pool)
    return [pod for pod in observed.pool_pods(pool) if (pod.deployment or own) == name]


def _serving(pods: list[ObservedPod]) -> int:
    return sum(1 for pod in pods if pod.ready and pod.serving)


def _deployments(observed: Observed, service: InferenceService) -> list[ObservedChild]:
    pools = service.spec.pools()
    return [
        child for child in observed.children
        if child.kind == "Deployment" and child.pool in pools and ours(child, service)
    ]  # fmt: skip


def _decide(
    service: InferenceService,
    observed: Observed,
    now: datetime,
    targets: Mapping[str, PoolTarget],
    spec_revision: str,
) -> tuple[Decision, dict[str, int]]:
    """The rollout's transition for this pass, from what the canary serves now against what
    its state before the pass asked of it; and that serving count per pool."""
    spec = service.spec
    pools = list(spec.pools())
    before = observed.canary
    running = active(before) and before is not None and before.revision == spec_revision
    serving: dict[str, int] = {}
    if running:
        for pool in pools:
            name = deployment_name(service, pool, spec_revision)
            serving[pool] = _serving(_pods_of(observed, service, pool, name))
    promoting = running and before is not None and before.phase == CanaryPhase.PROMOTING
    weight = before.weight if running and before is not None else 0
    asked = {
        pool: t.active if promoting else share(t.active, weight) for pool, t in targets.items()
    }
    enough = running and all(serving.get(pool, 0) >= asked[pool] for pool in pools)
    summary = ", ".join(f"{pool} {serving.get(pool, 0)}/{asked[pool]} serving" for pool in pools)
    annotations = service.metadata.get("annotations") or {}
    decision = decide(
        RolloutInput(
            rollout=spec.rollout,
            spec_revision=spec_revision,
            stable_revision=observed.revision,
            has_stable_spec=observed.stable_spec is not None,
            canary=before,
            actions=Actions.from_annotations(dict(annotations)),
            now=now,
            canary_serving=enough,
            promoted_serving=promoting and enough,
            pods_summary=summary,
            analysis=observed.analysis,
        )
    )
    return decision, serving


def _stable(
    service: InferenceService,
    observed: Observed,
    decision: Decision,
    spec_revision: str,
    default_image: str,
) -> tuple[StableSpec, InferenceService]:
    """The stable revision's record after this pass and the service as its pods see it: the
    spec itself once the spec's revision is stable (named after the canary it was promoted
    from, if it was one), else the recorded stable revision."""
    recorded = observed.stable_spec
    if decision.stable_revision != spec_revision:
        assert recorded is not None  # a canary runs only beside a recorded stable revision
        return recorded, with_stable_spec(service, recorded)
    named_after = recorded.deployment_revision if recorded else ""
    if decision.promoted and decision.canary is not None:
        named_after = decision.canary.revision
    return stable_spec(service.spec, default_image, named_after), service


def plan_rollout(
    service: InferenceService,
    observed: Observed,
    settings: OperatorSettings,
    now: datetime,
    targets: Mapping[str, PoolTarget],
) -> RolloutPlan:
    """The rollout's decision and the Deployments it runs, for one pass."""
    spec = service.spec
    pools = list(spec.pools())
    drain = settings.drain_seconds
    recorded = observed.stable_spec
    named_after = recorded.deployment_revision if recorded else ""
    spec_revision = revision(stable_spec(spec, settings.runtime_image, named_after))
    decision, serving = _decide(service, observed, now, targets, spec_revision)
    stable, stable_view = _stable(service, observed, decision, spec_revision,
                                  settings.runtime_image)  # fmt: skip

    after = decision.canary if active(decision.canary) else None
    names = {pool: deployment_name(service, pool, stable.deployment_revision) for pool in pools}
    canary_names = (
        {pool: deployment_name(service, pool, after.revision) for pool in pools} if after else {}
    )
    retiring = [
        child for child in _deployments(observed, service)
        if child.name not in {*names.values(), *canary_names.values()}
    ]  # fmt: skip
    retiring_pods = {
        child.name: _pods_of(observed, service, str(child.pool), child.name) for child in retiring
    }
    stable_targets, canary_targets = split(
        targets, after.weight if after else 0, serving,
        promoting=after is not None and after.phase == CanaryPhase.PROMOTING,
        gpus_per_pod=spec.runtime.gpu.count, budget=spec.autoscaling.gpu_budget,
        held_elsewhere=observed.retiring(pools) + sum(map(len, retiring_pods.values())),
    )  # fmt: skip

    tracks: list[Track] = []
    for pool in pools:
        t = stable_targets[pool]
        assignment = assign(
            _pods_of(observed, service, pool, names[pool]), t.active, t.spares, now, drain
        )
        tracks.append(Track(pool, names[pool], decision.stable_revision, STABLE, assignment,
                            stable_view, t))  # fmt: skip
    for pool, name in canary_names.items():
        assert after is not None
        c = canary_targets.get(pool, PoolTarget(0, 0, "canary", 0, 0))
        pods = _pods_of(observed, service, pool, name)
        assignment = assign(pods, c.active, c.spares, now, drain, serving_value=L.SERVING_CANARY)
        tracks.append(Track(pool, name, after.revision, CANARY, assignment, service, c))
    events: list[Event] = list(decision.events)
    keep: set[ChildKey] = set()
    for child in retiring:
        assignment = assign(retiring_pods[child.name], 0, 0, now, drain)
        if assignment.replicas > 0:
            keep.add(child.key)
        was = child.labels.get(L.REVISION, "")
        if assignment.demoted:
            events.append(Event("Demoted", f"{child.pool}: demoted {', '.join(assignment.demoted)}"
                                f"; drains up to {drain}s, then Deployment {child.name} "
                                f"({f'revision {was}' if was else 'an earlier revision'}) "
                                "is removed"))  # fmt: skip
        tracks.append(Track(str(child.pool), child.name, was, RETIRING, assignment))

    configs = _configs(service, observed, tracks)
    return RolloutPlan(decision, spec_revision, stable, tuple(tracks), stable_targets, configs,
                       frozenset(keep), tuple(events))  # fmt: skip


def _configs(service: InferenceService, observed: Observed, tracks: list[Track]) -> dict[str, str]:
    """The runtime config of every Deployment that runs, under its key; a retiring one keeps
    what the ConfigMap holds for it (its engines may restart while they drain)."""
    name = children.child_name(service, "runtime")
    current = next(
        (c.data for c in observed.children
         if c.kind == "ConfigMap" and c.name == name and ours(c, service)),
        {},
    )  # fmt: skip
    configs: dict[str, str] = {}
    for track in tracks:
        key = children.config_key(service, track.name)
        if track.view is not None:
            configs[key] = children.config_text(track.view, track.pool)
        elif key in current:
            configs.setdefault(key, current[key])
    return configs


def rollout_conditions(
    rollout: RolloutPlan,
    wanted: list[Condition],
    before: tuple[Condition, ...],
    now: datetime,
    generation: int | None,
) -> list[Condition]:
    """The conditions with the rollout's part: `Degraded` CanaryRolledBack while the spec asks
    for the revision that was rolled back (unless another problem is said), and
    `CanaryInProgress` once a rollout was seen (True while a canary runs, with why it waits)."""
    canary = rollout.decision.canary
    said: dict[str, tuple[ConditionStatus, str, str]] = {}
    rolled_back = (
        canary is not None
        and canary.phase == CanaryPhase.ROLLED_BACK
        and canary.failed_revision == rollout.spec_revision
    )
    degraded = next((c for c in wanted if c.type == "Degraded"), None)
    if rolled_back and canary is not None and (degraded is None or degraded.status != "True"):
        # A status written before `rollbackReason` existed: a failed analysis left its verdict.
        reason = canary.rollback_reason or (
            "CanaryRolledBack" if canary.verdict == "Fail" else "CanaryAborted"
        )
        said["Degraded"] = (ConditionStatus.TRUE, reason, canary.message)
    progress = _in_progress(canary)
    if progress is not None:
        said["CanaryInProgress"] = progress
    if not said:
        return wanted
    previous = {condition.type: condition for condition in before}
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    result = [c for c in wanted if c.type not in said]
    for kind, (status, reason, message) in said.items():
        old = previous.get(kind)
        since = old.last_transition_time if old and old.status == status else stamp
        result.append(
            Condition(type=kind, status=status, reason=reason, message=message,
                      last_transition_time=since, observed_generation=generation)
        )  # fmt: skip
    return result


def _in_progress(canary: CanaryStatus | None) -> tuple[ConditionStatus, str, str] | None:
    if canary is None:
        return None
    if active(canary):
        waits = {"WaitForSamples": "WaitingForSamples", "Unavailable": "AnalysisUnavailable"}
        reason = waits.get(canary.verdict, canary.phase)
        if canary.phase != CanaryPhase.PROGRESSING:
            reason = canary.phase
        return ConditionStatus.TRUE, reason, canary.message
    return ConditionStatus.FALSE, canary.phase or "Cancelled", canary.message or "No canary runs."
