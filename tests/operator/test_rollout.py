"""The canary state machine as tables: every transition of `rollout.decide`, when an analysis
is due, and what changes a revision."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from llmfleet.crds import InferenceService
from llmfleet.crds.inference_service import CanaryPhase, CanaryStatus
from llmfleet.crds.policy import AnalysisSpec, CanaryStep, RolloutSpec, RolloutStrategy
from llmfleet.operator.rollout import (
    Actions,
    Analysis,
    Decision,
    RolloutInput,
    Verdict,
    analysis_due,
    decide,
    next_analysis_in,
    revision,
    stable_spec,
)

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
CANARY = RolloutSpec(
    strategy=RolloutStrategy.CANARY,
    steps=[CanaryStep(weight=10, pause_seconds=60), CanaryStep(weight=50, pause_seconds=60)],
    analysis=AnalysisSpec(interval_seconds=20),
)
ROLLING = RolloutSpec()


def ago(seconds: float) -> str:
    return (NOW - timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def at(phase: CanaryPhase | str, step: int = 0, **fields: Any) -> CanaryStatus:
    """A canary of revision `new` beside `old` in `phase` at `step` (its weight)."""
    weight = CANARY.steps[step].weight if phase in ("Progressing", "Paused", "Promoting") else 0
    base: dict[str, Any] = {"phase": phase, "step": step, "weight": weight, "revision": "new",
                            "stable_revision": "old"}  # fmt: skip
    return CanaryStatus(**(base | fields))


def given(**fields: Any) -> RolloutInput:
    base: dict[str, Any] = {"rollout": CANARY, "spec_revision": "new", "stable_revision": "old",
                            "has_stable_spec": True, "canary": None, "actions": Actions(),
                            "now": NOW}  # fmt: skip
    return RolloutInput(**(base | fields))


PASS = Analysis(Verdict.PASS, "canary 120 requests, ITL p95 20 ms; stable 900, ITL p95 21 ms")
FAIL = Analysis(Verdict.FAIL, "canary 120 requests, ITL p95 90 ms; stable 900, ITL p95 21 ms",
                "ITL p95 of the canary 90 ms exceeds 1.5 x the stable's 21 ms")  # fmt: skip
WAIT = Analysis(Verdict.WAIT, "the canary served 12 of the 50 requests needed in 20s")
UNAVAILABLE = Analysis(Verdict.UNAVAILABLE, "Prometheus at http://prom:9090: connection refused")


@dataclass(frozen=True)
class Row:
    id: str
    given: RolloutInput
    stable: str = "old"
    """The stable revision after the pass."""
    phase: str | None = None
    """The canary's phase after the pass (None: no canary status at all)."""
    step: int = 0
    weight: int = 0
    events: tuple[str, ...] = ()
    expect: dict[str, Any] = field(default_factory=dict)
    """Other fields of the canary status after the pass."""
    said: str = ""
    """Words the canary's message (or the first event) must contain."""


ROWS = [
    # 1. Nothing to compare with, or not a canary rollout.
    Row("new-service-takes-its-revision", given(stable_revision=""), stable="new"),
    Row("rolling-update-takes-the-new-revision", given(rollout=ROLLING), stable="new"),
    Row("no-record-of-the-stable-spec-rolls-in-place", given(has_stable_spec=False),
        stable="new"),
    Row("rolling-update-cancels-a-running-canary",
        given(rollout=ROLLING, canary=at("Progressing", step=1)), stable="new", phase="", step=1,
        events=("CanaryCancelled",), said="no longer Canary"),
    # 2. Back at the stable revision.
    Row("steady-at-the-stable-revision", given(spec_revision="old")),
    Row("spec-back-at-stable-cancels-the-canary",
        given(spec_revision="old", canary=at("Progressing", step=1)), phase="", step=1,
        events=("CanaryCancelled",), said="back at the stable revision"),
    Row("promoted-then-steady", given(stable_revision="new", canary=at("Promoted")),
        stable="new", phase="Promoted"),
    # 4. A new revision.
    Row("new-revision-starts-a-canary", given(), phase="Progressing", weight=10,
        events=("CanaryStarted",), expect={"revision": "new", "stable_revision": "old",
                                           "step_started_at": None}),
    Row("newer-revision-replaces-the-canary",
        given(spec_revision="newer", canary=at("Progressing", step=1)), phase="Progressing",
        weight=10, events=("CanaryStarted",), expect={"revision": "newer"},
        said="replacing canary new"),
    # 9. Progressing.
    Row("waits-for-the-canary-pods", given(canary=at("Progressing")), phase="Progressing",
        weight=10, expect={"step_started_at": None}, said="waiting for the canary's pods"),
    Row("pods-serve-the-step-clock-starts",
        given(canary=at("Progressing"), canary_serving=True), phase="Progressing", weight=10,
        expect={"step_started_at": ago(0)}),
    Row("pass-before-the-step-ends-stays",
        given(canary=at("Progressing", step_started_at=ago(30)), analysis=PASS),
        phase="Progressing", weight=10,
        expect={"verdict": "Pass", "last_analysis_time": ago(0), "step_started_at": ago(30)}),
    Row("pass-at-the-step-end-advances",
        given(canary=at("Progressing", step_started_at=ago(60)), analysis=PASS),
        phase="Progressing", step=1, weight=50, events=("CanaryStep",),
        expect={"step_started_at": None, "verdict": "Pass"}, said="step 2 of 2"),
    Row("pass-at-the-last-step-end-promotes",
        given(canary=at("Progressing", step=1, step_started_at=ago(61)), analysis=PASS),
        phase="Promoting", step=1, weight=50, events=("CanaryPromoting",)),
    Row("too-few-requests-at-the-step-end-waits",
        given(canary=at("Progressing", step_started_at=ago(90)), analysis=WAIT),
        phase="Progressing", weight=10, expect={"verdict": "WaitForSamples"},
        said="waiting for samples"),
    Row("prometheus-unreachable-holds",
        given(canary=at("Progressing", step=1, step_started_at=ago(90)), analysis=UNAVAILABLE),
        phase="Progressing", step=1, weight=50, expect={"verdict": "Unavailable"},
        said="holding, no verdict without metrics"),
    Row("fail-rolls-back",
        given(canary=at("Progressing", step_started_at=ago(20)), analysis=FAIL),
        phase="RolledBack", weight=0, events=("CanaryRolledBack",),
        expect={"failed_revision": "new", "verdict": "Fail", "step_started_at": None},
        said="ITL p95 of the canary 90 ms exceeds 1.5 x the stable's 21 ms"),
    Row("fail-at-a-later-step-rolls-back",
        given(canary=at("Progressing", step=1, step_started_at=ago(20)), analysis=FAIL),
        phase="RolledBack", step=1, weight=0, events=("CanaryRolledBack",),
        expect={"failed_revision": "new"}, said="at step 2 (weight 50%)"),
    # The progress deadline (1800 s by default) while the canary waits for its pods.
    Row("new-canary-starts-the-wait-clock", given(), phase="Progressing", weight=10,
        events=("CanaryStarted",), expect={"waiting_since": ago(0)}),
    Row("waiting-within-the-deadline-waits",
        given(canary=at("Progressing", waiting_since=ago(1799)), pods_summary="unified 0/1"),
        phase="Progressing", weight=10, expect={"waiting_since": ago(1799)},
        said="waiting for the canary's pods"),
    Row("pods-not-serving-past-the-deadline-roll-back",
        given(canary=at("Progressing", step=1, waiting_since=ago(1800)),
              pods_summary="unified 0/1 serving"),
        phase="RolledBack", step=1, events=("CanaryProgressDeadlineExceeded",),
        expect={"failed_revision": "new", "waiting_since": None, "verdict": "",
                "rollback_reason": "CanaryProgressDeadlineExceeded"},
        said="did not serve weight 50% within spec.rollout.progressDeadlineSeconds (1800s; "
             "unified 0/1 serving)"),
    Row("a-shorter-deadline-is-the-spec-s",
        given(rollout=CANARY.model_copy(update={"progress_deadline_seconds": 120}),
              canary=at("Progressing", waiting_since=ago(121))),
        phase="RolledBack", events=("CanaryProgressDeadlineExceeded",), said="(120s;"),
    Row("a-status-without-a-wait-clock-starts-it-now",
        given(canary=at("Progressing")), phase="Progressing", weight=10,
        expect={"waiting_since": ago(0)}),
    Row("pods-serving-stop-the-wait-clock",
        given(canary=at("Progressing", waiting_since=ago(1790)), canary_serving=True),
        phase="Progressing", weight=10,
        expect={"waiting_since": None, "step_started_at": ago(0)}),
    Row("a-serving-step-has-no-deadline",
        given(canary=at("Progressing", step_started_at=ago(5000)), analysis=WAIT),
        phase="Progressing", weight=10, expect={"verdict": "WaitForSamples"}),
    Row("advancing-starts-the-next-wait",
        given(canary=at("Progressing", step_started_at=ago(60)), analysis=PASS),
        phase="Progressing", step=1, weight=50, events=("CanaryStep",),
        expect={"waiting_since": ago(0)}),
    Row("promoting-past-the-deadline-rolls-back",
        given(canary=at("Promoting", step=1, waiting_since=ago(1800)),
              pods_summary="unified 2/4 serving"),
        phase="RolledBack", step=1, events=("CanaryProgressDeadlineExceeded",),
        said="did not serve the whole target"),
    Row("pausing-stops-the-wait-clock",
        given(canary=at("Progressing", waiting_since=ago(1000)), actions=Actions(paused=True)),
        phase="Paused", weight=10, events=("CanaryPaused",), expect={"waiting_since": None}),
    Row("failed-analysis-says-its-reason",
        given(canary=at("Progressing", step_started_at=ago(20)), analysis=FAIL),
        phase="RolledBack", events=("CanaryRolledBack",),
        expect={"rollback_reason": "CanaryRolledBack"}),
    # 3. A rolled-back revision.
    Row("rolled-back-revision-is-not-retried",
        given(canary=at("RolledBack", failed_revision="new")), phase="RolledBack",
        expect={"failed_revision": "new"}),
    Row("retry-annotation-starts-it-again",
        given(canary=at("RolledBack", failed_revision="new"), actions=Actions(retry="1")),
        phase="Progressing", weight=10, events=("CanaryStarted",),
        expect={"failed_revision": "", "handled": {"retry": "1"}}, said="again"),
    Row("a-retry-value-acted-on-does-nothing-again",
        given(canary=at("RolledBack", failed_revision="new", handled={"retry": "1"}),
              actions=Actions(retry="1")),
        phase="RolledBack", expect={"failed_revision": "new"}),
    Row("a-new-spec-after-a-rollback-starts-its-canary",
        given(spec_revision="newer", canary=at("RolledBack", failed_revision="new")),
        phase="Progressing", weight=10, events=("CanaryStarted",),
        expect={"revision": "newer", "failed_revision": ""}),
    Row("spec-back-at-stable-after-a-rollback-forgets-the-failure",
        given(spec_revision="old", canary=at("RolledBack", failed_revision="new")),
        phase="RolledBack", expect={"failed_revision": ""}),
    # 5. Abort.
    Row("abort-rolls-back",
        given(canary=at("Progressing", step=1, step_started_at=ago(5)),
              actions=Actions(abort="now")),
        phase="RolledBack", step=1, events=("CanaryAborted",),
        expect={"failed_revision": "new", "handled": {"abort": "now"}}, said="aborted"),
    Row("abort-while-paused-rolls-back",
        given(canary=at("Paused"), actions=Actions(paused=True, abort="x")),
        phase="RolledBack", events=("CanaryAborted",)),
    Row("abort-while-promoting-rolls-back",
        given(canary=at("Promoting", step=1), actions=Actions(abort="x")),
        phase="RolledBack", step=1, events=("CanaryAborted",)),
    Row("an-abort-value-acted-on-does-not-abort-the-next-canary",
        given(spec_revision="newer", canary=at("RolledBack", handled={"abort": "x"}),
              actions=Actions(abort="x")),
        phase="Progressing", weight=10, events=("CanaryStarted",),
        expect={"revision": "newer"}),
    # 6. Promote at once; 7. promoting.
    Row("promote-annotation-promotes-at-once",
        given(canary=at("Progressing", step_started_at=ago(5)), actions=Actions(promote="1")),
        phase="Promoting", weight=10, events=("CanaryPromoting",),
        expect={"handled": {"promote": "1"}}),
    Row("promote-while-paused-promotes",
        given(canary=at("Paused"), actions=Actions(paused=True, promote="1")),
        phase="Promoting", weight=10, events=("CanaryPromoting",)),
    Row("promote-without-a-canary-is-only-remembered",
        given(spec_revision="old", actions=Actions(promote="1")), phase="",
        expect={"handled": {"promote": "1"}}),
    Row("promoting-waits-for-the-whole-target",
        given(canary=at("Promoting", step=1), pods_summary="unified 2/4 serving"),
        phase="Promoting", step=1, weight=50, said="unified 2/4 serving"),
    Row("promoting-done-the-canary-is-stable",
        given(canary=at("Promoting", step=1), promoted_serving=True), stable="new",
        phase="Promoted", step=1, weight=0, events=("CanaryPromoted",)),
    # 8. Pause and resume.
    Row("pause-annotation-pauses",
        given(canary=at("Progressing", step_started_at=ago(30)), actions=Actions(paused=True)),
        phase="Paused", weight=10, events=("CanaryPaused",), expect={"step_started_at": None}),
    Row("paused-stays-paused", given(canary=at("Paused"), actions=Actions(paused=True)),
        phase="Paused", weight=10),
    Row("resume-starts-the-step-over",
        given(canary=at("Paused", step=1), canary_serving=True), phase="Progressing", step=1,
        weight=50, events=("CanaryResumed",), expect={"step_started_at": ago(0)}),
]  # fmt: skip


@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
def test_transition(row: Row) -> None:
    decision = decide(row.given)
    assert decision.stable_revision == row.stable
    assert [event.reason for event in decision.events] == list(row.events)
    canary = decision.canary
    if row.phase is None:
        assert canary is None
        return
    assert canary is not None
    assert (canary.phase, canary.step, canary.weight) == (row.phase, row.step, row.weight)
    for name, value in row.expect.items():
        assert getattr(canary, name) == value, name
    if row.said:
        text = canary.message + " ".join(event.message for event in decision.events)
        assert row.said in text


def test_every_event_of_a_rollback_is_a_warning_and_counted() -> None:
    decision = decide(given(canary=at("Progressing", step_started_at=ago(20)), analysis=FAIL))
    assert decision.rolled_back
    assert all(event.warning for event in decision.events)
    assert decide(given(canary=at("Progressing"))).rolled_back is False


def test_advancing_is_counted_once() -> None:
    advanced = decide(given(canary=at("Progressing", step_started_at=ago(60)), analysis=PASS))
    assert advanced.steps_advanced == 1
    assert decide(given(canary=at("Progressing", step_started_at=ago(5)))).steps_advanced == 0


def _again(first: Decision, row: RolloutInput) -> Decision:
    """The next pass of an operator that only has the status written by `first`."""
    return decide(replace(row, stable_revision=first.stable_revision, canary=first.canary,
                          analysis=None))  # fmt: skip


@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
def test_a_restart_resumes_at_the_same_step_without_repeating_events(row: Row) -> None:
    """State lives in the status: a second pass on what the first wrote (a restarted operator,
    or a pass woken by anything) keeps the phase, step and weight and posts nothing again."""
    first = decide(row.given)
    second = _again(first, row.given)
    before, after = first.canary, second.canary
    assert second.stable_revision == first.stable_revision
    if before is None:
        assert after is None
        return
    assert after is not None
    assert (after.phase, after.step, after.weight) == (before.phase, before.step, before.weight)
    # Starting the step's clock, resuming or leaving a pause are single events, not repeated.
    assert not [e for e in second.events if e.reason in {e.reason for e in first.events}]


def test_a_step_advances_only_on_a_pass_taken_after_its_time() -> None:
    """Walk both steps with an analysis every 20 s: two steps of 60 s take six passing
    analyses after the pods serve, then promotion."""
    now = NOW
    status: CanaryStatus | None = None
    stable = "old"
    verdicts: list[str] = []
    for _ in range(40):
        row = given(now=now, canary=status, stable_revision=stable, canary_serving=True,
                    promoted_serving=True)  # fmt: skip
        if analysis_due(status, CANARY, now):
            row = replace(row, analysis=PASS)
            verdicts.append(f"{status.step if status else '-'}@{(now - NOW).seconds}")
        decision = decide(row)
        status, stable = decision.canary, decision.stable_revision
        if status is not None and status.phase == CanaryPhase.PROMOTED:
            break
        now += timedelta(seconds=5)
    assert stable == "new"
    assert status is not None
    assert status.phase == CanaryPhase.PROMOTED
    # Step 1 starts at 5 s (pods serve), is analysed at 25, 45 and 65 s (its end), step 2
    # starts at 70 s and ends at 130 s.
    assert verdicts == ["0@25", "0@45", "0@65", "1@90", "1@110", "1@130"]


@dataclass(frozen=True)
class Due:
    id: str
    canary: CanaryStatus | None
    wait: float | None
    """Seconds until the next analysis (None: none will be)."""


DUE = [
    Due("no-canary", None, None),
    Due("paused", at("Paused", step_started_at=ago(100)), None),
    Due("promoting", at("Promoting", step=1), None),
    Due("pods-not-serving-yet", at("Progressing"), None),
    Due("an-interval-after-the-step-started", at("Progressing", step_started_at=ago(5)), 15),
    Due("due-now", at("Progressing", step_started_at=ago(20)), 0),
    Due("an-interval-after-the-last",
        at("Progressing", step_started_at=ago(30), last_analysis_time=ago(10)), 10),
    Due("the-step-end-comes-first",
        at("Progressing", step_started_at=ago(50), last_analysis_time=ago(5)), 10),
    Due("after-the-step-end-every-interval",
        at("Progressing", step_started_at=ago(100), last_analysis_time=ago(30)), -10),
    Due("an-analysis-of-the-earlier-step-is-ignored",
        at("Progressing", step=1, step_started_at=ago(4), last_analysis_time=ago(6)), 16),
]  # fmt: skip


@pytest.mark.parametrize("row", DUE, ids=[row.id for row in DUE])
def test_when_an_analysis_is_due(row: Due) -> None:
    assert next_analysis_in(row.canary, CANARY, NOW) == row.wait
    assert analysis_due(row.canary, CANARY, NOW) == (row.wait is not None and row.wait <= 0)


BASE = {
    "metadata": {"name": "chat", "namespace": "team"},
    "spec": {"model": {"name": "m"}, "runtime": {"gpu": {"type": "H100", "count": 1}}},
}


def _revision(changes: dict[str, Any], image: str = "ghcr.io/llmfleet/runtime:1") -> str:
    spec = {**BASE["spec"], **changes}  # type: ignore[dict-item]
    service = InferenceService.model_validate({**BASE, "spec": spec})
    return revision(stable_spec(service.spec, image))


@pytest.mark.parametrize(
    ("changes", "same"),
    [
        pytest.param({"topology": {"unified": {"replicas": 5}}}, True, id="replicas"),
        pytest.param({"slo": {"ttftP95Ms": 300}}, True, id="slo"),
        pytest.param({"autoscaling": {"warmSpares": 2}}, True, id="spares"),
        pytest.param({"rollout": {"strategy": "Canary", "steps": [{"weight": 5}]}}, True,
                     id="rollout"),
        pytest.param({"runtime": {"gpu": {"type": "H100", "count": 1}, "prefixCaching": True}},
                     True, id="a-default-spelled-out"),
        pytest.param({"model": {"name": "other"}}, False, id="model"),
        pytest.param({"runtime": {"gpu": {"type": "H100", "count": 2}}}, False, id="gpus"),
        pytest.param({"runtime": {"gpu": {"type": "H100", "count": 1}, "image": "img:2"}}, False,
                     id="image"),
        pytest.param({"runtime": {"gpu": {"type": "H100", "count": 1},
                                  "env": [{"name": "A", "value": "1"}]}}, False, id="env"),
        pytest.param({"runtime": {"gpu": {"type": "H100", "count": 1}, "maxNumSeqs": 8}}, False,
                     id="engine-setting"),
    ],
)  # fmt: skip
def test_what_changes_the_revision(changes: dict[str, Any], same: bool) -> None:
    assert (_revision(changes) == _revision({})) is same


def test_the_default_image_is_part_of_the_revision() -> None:
    explicit = {"runtime": {"gpu": {"type": "H100", "count": 1}, "image": "img:1"}}
    assert _revision({}, image="img:1") == _revision(explicit)
    assert _revision({}, image="img:1") != _revision({}, image="img:2")
    assert len(_revision({})) == 10
