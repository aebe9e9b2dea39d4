"""Canary rollouts (pure): revisions, and the step and analysis state machine.

A revision is a hash of what makes the pods: the model and the runtime (image resolved, GPUs,
env). A spec change that alters it rolls out by `spec.rollout.strategy`: `RollingUpdate`
replaces the pods in place (the revision is stable at once); `Canary` starts the new revision
beside the stable one and walks `rollout.steps`, each a share of the traffic held for its
`pauseSeconds` while an analysis compares canary and stable every `analysis.intervalSeconds`.

`decide()` is one transition of that machine. Everything it remembers is in
`status.canary` (and `status.revision`), never in memory: an operator that restarts reads the
same status and resumes at the same step. Its inputs are that status, the spec's revision, the
annotations' actions, whether the canary's pods serve, and the verdict of an analysis taken in
this pass (None when none was due).

Transitions, in the order they are checked:
1. No stable revision yet, strategy `RollingUpdate`, or no record of the stable revision's spec
   (`status.stableSpec`, written since canaries exist): the spec's revision is stable at once;
   a canary in progress is cancelled.
2. The spec is back at the stable revision: a canary in progress is cancelled.
3. The spec's revision was rolled back: nothing runs until the spec changes or the retry
   annotation gets a new value (then its canary starts again at the first step).
4. A new revision (no canary, or a canary of another revision): its canary starts at step 0.
5. The abort annotation's new value: rolled back (weight 0 at once, the revision remembered).
6. The promote annotation's new value: promoting at once.
7. Promoting: promoted once the canary serves the whole target (the canary becomes stable).
8. The pause annotation: paused (weight kept, no analysis, the step's clock stopped); taken
   off, the step starts over.
9. Progressing: the step's clock starts when the canary's pods for its weight serve. A `Fail`
   verdict rolls back; `Pass` once the step's time is up advances (the last step promotes);
   `WaitForSamples` (too few requests) and `Unavailable` (Prometheus unreachable) hold.

While the canary waits for its pods (a step's weight in 9, the whole target in 7) the wait is
timed from `status.canary.waitingSince`: past `rollout.progressDeadlineSeconds` the canary is
rolled back (`CanaryProgressDeadlineExceeded`), so pods that never turn Ready (a crash loop, no
GPU left) do not hold a rollout forever.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum

from llmfleet.crds import InferenceServiceSpec
from llmfleet.crds import labels as L
from llmfleet.crds.admission_policy import PAUSE_VALUES
from llmfleet.crds.inference_service import CanaryPhase, CanaryStatus, StableSpec
from llmfleet.crds.policy import RolloutSpec, RolloutStrategy

ACTIVE = (CanaryPhase.PROGRESSING, CanaryPhase.PAUSED, CanaryPhase.PROMOTING)
"""Phases in which a canary runs (and has pods)."""
WAIT_FOR_PODS_SECONDS = 2.0
"""How soon to look again while the canary's pods start (as the operator does for pools)."""


def stable_spec(
    spec: InferenceServiceSpec, default_image: str, deployment_revision: str = ""
) -> StableSpec:
    """What makes the pods of the spec's revision: its model and runtime as the spec says them,
    and the image they run (a new default image is a new revision too)."""
    return StableSpec(
        model=spec.model,
        runtime=spec.runtime,
        image=spec.runtime.image or default_image,
        deployment_revision=deployment_revision,
    )


def revision(made_of: StableSpec) -> str:
    """Ten hex digits of a hash of the model, the runtime and the image (defaults written out,
    so a spec that spells a default and one that leaves it out are the same revision)."""
    wire = made_of.to_wire()
    parts = {key: wire.get(key) for key in ("model", "runtime", "image")}
    parts["runtime"] = {k: v for k, v in wire["runtime"].items() if k != "image"}
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:10]


class Verdict(StrEnum):
    PASS = "Pass"
    FAIL = "Fail"
    WAIT = "WaitForSamples"
    UNAVAILABLE = "Unavailable"


@dataclass(frozen=True)
class Analysis:
    """One comparison of canary and stable (see `analysis.py`)."""

    verdict: Verdict
    summary: str
    """One line with the figures, e.g. `canary 212 requests, TTFT p95 80 ms, ...`."""
    failed: str = ""
    """With `Fail`: the check that failed and both figures."""


def unknown_pause(annotations: dict[str, str]) -> str | None:
    """The `rollout-pause` value the operator does not read (None: absent, or one it reads).
    It reads exactly what the admission policy lets in, `"true"` (paused) and `"false"`; a
    value an object kept from before the policy (`True`, `yes`) pauses nothing, and the
    condition `RolloutAnnotationUnknown` says so (`conditions`)."""
    value = annotations.get(L.ROLLOUT_PAUSE)
    return None if value is None or value in PAUSE_VALUES else value


@dataclass(frozen=True)
class Actions:
    """What the annotations ask (`labels.ROLLOUT_*`); the one-shot actions by value. Paused only
    by `"true"` exactly, as the admission policy accepts it (`unknown_pause`)."""

    paused: bool = False
    promote: str | None = None
    abort: str | None = None
    retry: str | None = None

    @classmethod
    def from_annotations(cls, annotations: dict[str, str]) -> Actions:
        return cls(
            paused=annotations.get(L.ROLLOUT_PAUSE) == "true",
            promote=annotations.get(L.ROLLOUT_PROMOTE),
            abort=annotations.get(L.ROLLOUT_ABORT),
            retry=annotations.get(L.ROLLOUT_RETRY),
        )


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to post on the service (the rollout's and the plan's)."""

    reason: str
    message: str
    warning: bool = False


@dataclass(frozen=True)
class RolloutInput:
    rollout: RolloutSpec
    spec_revision: str
    stable_revision: str
    """`status.revision` ("" for a new service)."""
    has_stable_spec: bool
    """`status.stableSpec` is recorded (its pods can be rendered beside a canary)."""
    canary: CanaryStatus | None
    actions: Actions
    now: datetime
    canary_serving: bool = False
    """The canary's pods for the current weight serve (at least one per pool)."""
    promoted_serving: bool = False
    """The canary serves the whole target (what promotion waits for)."""
    pods_summary: str = ""
    """How many canary pods serve of how many wanted, for the messages."""
    analysis: Analysis | None = None
    """The verdict of an analysis taken in this pass, or None."""


@dataclass(frozen=True)
class Decision:
    stable_revision: str
    canary: CanaryStatus | None
    events: tuple[Event, ...] = ()
    requeue_after: float | None = None
    steps_advanced: int = 0
    """For the metric: 1 when this pass moved to the next step (or to promoting)."""
    rolled_back: bool = False

    @property
    def promoted(self) -> bool:
        """This pass made the canary stable."""
        return self.canary is not None and self.canary.phase == CanaryPhase.PROMOTED


def _with(canary: CanaryStatus, **fields: object) -> CanaryStatus:
    return canary.model_copy(update=fields)


def _stamp(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse(stamp: str | None) -> datetime | None:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")) if stamp else None


def active(canary: CanaryStatus | None) -> bool:
    return canary is not None and canary.phase in ACTIVE and bool(canary.revision)


def fresh_actions(actions: Actions, handled: dict[str, str]) -> dict[str, str]:
    """The one-shot actions whose annotation value was not acted on yet."""
    given = {"promote": actions.promote, "abort": actions.abort, "retry": actions.retry}
    return {a: v for a, v in given.items() if v is not None and handled.get(a) != v}


def analysis_due(canary: CanaryStatus | None, rollout: RolloutSpec, now: datetime) -> bool:
    """Whether this pass should ask Prometheus: a progressing canary whose step has started,
    an interval after the last analysis (or the step's start), and at the step's end."""
    wait = next_analysis_in(canary, rollout, now)
    return wait is not None and wait <= 0


def next_analysis_in(
    canary: CanaryStatus | None, rollout: RolloutSpec, now: datetime
) -> float | None:
    """Seconds until the next analysis is due (<= 0: now); None when none will be."""
    if canary is None or canary.phase != CanaryPhase.PROGRESSING or not rollout.steps:
        return None
    started = _parse(canary.step_started_at)
    if started is None:
        return None
    interval = timedelta(seconds=rollout.analysis.interval_seconds)
    step_end = started + timedelta(seconds=rollout.steps[canary.step].pause_seconds)
    last = _parse(canary.last_analysis_time)
    if last is not None and last < started:
        last = None  # an analysis of an earlier step
    due = (last or started) + interval
    if last is None or last < step_end:
        due = min(due, step_end)  # a verdict taken at the step's end decides the step
    return (due - now).total_seconds()


def _start(i: RolloutInput, handled: dict[str, str], why: str) -> Decision:
    weight = i.rollout.steps[0].weight
    canary = CanaryStatus(
        phase=CanaryPhase.PROGRESSING,
        weight=weight,
        step=0,
        revision=i.spec_revision,
        stable_revision=i.stable_revision,
        message=f"Starting the canary's pods for step 1 (weight {weight}%).",
        handled=handled,
        waiting_since=_stamp(i.now),
    )
    message = (f"Canary of revision {i.spec_revision} started beside {i.stable_revision}{why}: "
               f"step 1 of {len(i.rollout.steps)}, weight {weight}%.")  # fmt: skip
    return Decision(
        i.stable_revision, canary, (Event("CanaryStarted", message),), WAIT_FOR_PODS_SECONDS
    )


def _rolled_back(
    i: RolloutInput, canary: CanaryStatus, reason: str, failed: str, analysis: Analysis | None
) -> Decision:
    message = (f"Canary {canary.revision} rolled back at step {canary.step + 1} "
               f"(weight {canary.weight}%): {failed}. Traffic is back on {i.stable_revision}; "
               f"{canary.revision} is not tried again until the spec changes or "
               f"{L.ROLLOUT_RETRY} gets a new value.")  # fmt: skip
    after = _with(
        canary,
        phase=CanaryPhase.ROLLED_BACK,
        weight=0,
        failed_revision=canary.revision,
        message=message,
        step_started_at=None,
        waiting_since=None,
        rollback_reason=reason,
        **(
            {"verdict": analysis.verdict.value, "last_analysis": analysis.summary,
             "last_analysis_time": _stamp(i.now)}
            if analysis is not None else {"verdict": ""}
        ),
    )  # fmt: skip
    event = Event(reason, message, warning=True)
    return Decision(i.stable_revision, after, (event,), None, rolled_back=True)


def decide(i: RolloutInput) -> Decision:  # noqa: PLR0911, PLR0912 - one branch per transition
    """One transition (see the module's docstring for the table)."""
    before = i.canary or CanaryStatus()
    fresh = fresh_actions(i.actions, before.handled)
    handled = before.handled | fresh
    running = active(i.canary)
    # A rolled-back revision is remembered only while the spec still asks for it.
    failed = before.failed_revision if before.failed_revision == i.spec_revision else ""
    kept = _with(before, handled=handled, failed_revision=failed)

    # 1. Nothing to compare with, or not a canary rollout: the spec's revision is stable.
    canary_strategy = i.rollout.strategy == RolloutStrategy.CANARY and bool(i.rollout.steps)
    if not i.stable_revision or not canary_strategy or not i.has_stable_spec:
        events: tuple[Event, ...] = ()
        if running:
            events = (Event("CanaryCancelled", f"Canary {before.revision} cancelled: "
                            + ("spec.rollout.strategy is no longer Canary; the spec's revision "
                               f"{i.spec_revision} rolls out in place."
                               if not canary_strategy else
                               "no record of the stable revision's spec.")),)  # fmt: skip
            kept = _with(kept, phase="", weight=0, step_started_at=None, message="",
                         waiting_since=None)  # fmt: skip
        canary = kept if kept != CanaryStatus() else None
        return Decision(i.spec_revision, canary, events)

    # 2. Back at the stable revision.
    if i.spec_revision == i.stable_revision:
        if not running:
            return Decision(i.stable_revision, kept if kept != CanaryStatus() else None)
        message = (f"Canary {before.revision} cancelled: the spec is back at the stable "
                   f"revision {i.stable_revision}.")  # fmt: skip
        after = _with(kept, phase="", weight=0, step_started_at=None, message=message,
                      waiting_since=None)  # fmt: skip
        return Decision(i.stable_revision, after, (Event("CanaryCancelled", message),))

    # 3. The spec's revision was rolled back: wait for a new spec or a retry.
    if failed:
        if "retry" in fresh:
            retried = replace(i, canary=_with(kept, failed_revision=""))
            return _start(retried, handled, f" again ({L.ROLLOUT_RETRY})")
        return Decision(i.stable_revision, kept)

    # 4. A new revision.
    if not running or before.revision != i.spec_revision:
        why = f", replacing canary {before.revision}" if running else ""
        return _start(i, handled, why)

    # 5. Abort.
    if "abort" in fresh:
        return _rolled_back(i, kept, "CanaryAborted", f"aborted ({L.ROLLOUT_ABORT})", None)

    # 6. Promote at once.
    if "promote" in fresh and kept.phase != CanaryPhase.PROMOTING:
        message = f"Promoting canary {kept.revision} at once ({L.ROLLOUT_PROMOTE})."
        after = _with(kept, phase=CanaryPhase.PROMOTING, step_started_at=None, message=message,
                      waiting_since=_stamp(i.now))  # fmt: skip
        return Decision(i.stable_revision, after, (Event("CanaryPromoting", message),),
                        WAIT_FOR_PODS_SECONDS, steps_advanced=1)  # fmt: skip

    # 7. Promoting: the canary scales to the whole target, then becomes stable.
    if kept.phase == CanaryPhase.PROMOTING:
        if not i.promoted_serving:
            message = f"Promoting: the canary's pods scale to the whole target ({i.pods_summary})."
            return _wait_for_pods(i, _with(kept, message=message), (), "the whole target")
        message = (f"Canary {kept.revision} promoted: it is the stable revision now; "
                   f"{i.stable_revision} drains and scales down.")  # fmt: skip
        after = _with(kept, phase=CanaryPhase.PROMOTED, weight=0, message=message,
                      waiting_since=None)  # fmt: skip
        return Decision(kept.revision, after, (Event("CanaryPromoted", message),))

    # 8. Paused by annotation.
    if i.actions.paused:
        if kept.phase == CanaryPhase.PAUSED:
            return Decision(i.stable_revision, kept)
        message = (f"Paused at step {kept.step + 1} (weight {kept.weight}%) by "
                   f"{L.ROLLOUT_PAUSE}; remove it to resume (the step starts over).")  # fmt: skip
        after = _with(kept, phase=CanaryPhase.PAUSED, step_started_at=None, message=message,
                      waiting_since=None)  # fmt: skip
        return Decision(i.stable_revision, after, (Event("CanaryPaused", message),))
    resumed: tuple[Event, ...] = ()
    if kept.phase == CanaryPhase.PAUSED:
        message = f"Resumed at step {kept.step + 1} (weight {kept.weight}%)."
        kept = _with(kept, phase=CanaryPhase.PROGRESSING, message=message)
        resumed = (Event("CanaryResumed", message),)

    # 9. Progressing.
    return _progress(i, kept, resumed)


def _progress(i: RolloutInput, canary: CanaryStatus, events: tuple[Event, ...]) -> Decision:
    steps = i.rollout.steps
    step = steps[canary.step]
    if canary.step_started_at is None:
        if not i.canary_serving:
            message = (f"Step {canary.step + 1}: waiting for the canary's pods for weight "
                       f"{canary.weight}% ({i.pods_summary}).")  # fmt: skip
            return _wait_for_pods(i, _with(canary, message=message), events,
                                  f"weight {canary.weight}%")  # fmt: skip
        canary = _with(canary, step_started_at=_stamp(i.now), waiting_since=None,
                         message=f"Step {canary.step + 1}: weight {canary.weight}% served, "
                         f"analysed every {i.rollout.analysis.interval_seconds}s for "
                         f"{step.pause_seconds}s.")  # fmt: skip
    analysis = i.analysis
    if analysis is not None:
        canary = _with(canary, verdict=analysis.verdict.value, last_analysis=analysis.summary,
                         last_analysis_time=_stamp(i.now))  # fmt: skip
        if analysis.verdict == Verdict.FAIL:
            rolled = _rolled_back(i, canary, "CanaryRolledBack", analysis.failed, analysis)
            return replace(rolled, events=events + rolled.events)
        started = _parse(canary.step_started_at)
        assert started is not None
        elapsed = (i.now - started).total_seconds() >= step.pause_seconds
        if analysis.verdict == Verdict.PASS and elapsed:
            return _advance(i, canary, events)
        if analysis.verdict == Verdict.WAIT:
            canary = _with(canary, message=f"Step {canary.step + 1}: waiting for samples "
                             f"before any verdict: {analysis.summary}")  # fmt: skip
        elif analysis.verdict == Verdict.UNAVAILABLE:
            canary = _with(canary, message=f"Step {canary.step + 1}: holding, no verdict "
                             f"without metrics: {analysis.summary}")  # fmt: skip
        else:
            canary = _with(canary, message=f"Step {canary.step + 1}: weight "
                             f"{canary.weight}%, passing so far.")  # fmt: skip
    wait = next_analysis_in(canary, i.rollout, i.now)
    return Decision(i.stable_revision, canary, events, max(wait, 1.0) if wait is not None else None)


def _advance(i: RolloutInput, canary: CanaryStatus, events: tuple[Event, ...]) -> Decision:
    steps = i.rollout.steps
    if canary.step + 1 >= len(steps):
        message = (f"Every step passed; promoting canary {canary.revision}: it scales to the "
                   "whole target, then takes all the traffic.")  # fmt: skip
        after = _with(canary, phase=CanaryPhase.PROMOTING, step_started_at=None,
                        message=message, waiting_since=_stamp(i.now))  # fmt: skip
        event = Event("CanaryPromoting", message)
        return Decision(i.stable_revision, after, (*events, event), WAIT_FOR_PODS_SECONDS,
                        steps_advanced=1)  # fmt: skip
    index = canary.step + 1
    weight = steps[index].weight
    message = (f"Step {canary.step + 1} passed ({canary.last_analysis}); step {index + 1} of "
               f"{len(steps)}: weight {weight}%.")  # fmt: skip
    after = _with(canary, step=index, weight=weight, step_started_at=None, message=message,
                  waiting_since=_stamp(i.now))  # fmt: skip
    return Decision(i.stable_revision, after, (*events, Event("CanaryStep", message)),
                    WAIT_FOR_PODS_SECONDS, steps_advanced=1)  # fmt: skip


def _wait_for_pods(
    i: RolloutInput, canary: CanaryStatus, events: tuple[Event, ...], target: str
) -> Decision:
    """Wait for the canary's pods to serve `target`, at most `progressDeadlineSeconds` from
    `waitingSince` (a status written before that field existed, or a resumed step, starts the
    clock now); past it the canary is rolled back."""
    since = _parse(canary.waiting_since)
    if since is None:
        since = i.now
        canary = _with(canary, waiting_since=_stamp(i.now))
    deadline = i.rollout.progress_deadline_seconds
    left = deadline - (i.now - since).total_seconds()
    if left <= 0:
        failed = (f"its pods did not serve {target} within spec.rollout.progressDeadlineSeconds "
                  f"({deadline}s; {i.pods_summary})")  # fmt: skip
        rolled = _rolled_back(i, canary, "CanaryProgressDeadlineExceeded", failed, None)
        return replace(rolled, events=events + rolled.events)
    return Decision(i.stable_revision, canary, events, min(WAIT_FOR_PODS_SECONDS, left))
