"""The operator reads `llmfleet.dev/rollout-pause` exactly as the admission policy accepts it
(`"true"` pauses, `"false"` does not), and says so once per change when an object kept from
before the policy holds another value: the condition `RolloutAnnotationUnknown` and one Event
(pure: `plan.desired` over a sequence of passes, each observing the conditions the last one
wrote)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from llmfleet.crds import Condition
from llmfleet.crds.labels import ROLLOUT_PAUSE
from llmfleet.operator.observed import Observed
from llmfleet.operator.plan import desired
from llmfleet.operator.rollout import Actions, unknown_pause
from tests.operator.test_plan import NOW, SETTINGS, load


@pytest.mark.parametrize(
    ("value", "paused", "unknown"),
    [
        pytest.param(None, False, None, id="absent"),
        pytest.param("true", True, None, id="true"),
        pytest.param("false", False, None, id="false"),
        pytest.param("True", False, "True", id="capitalised-is-not-read"),
        pytest.param(" true", False, " true", id="spaced-is-not-read"),
        pytest.param("yes", False, "yes", id="yes-is-not-read"),
        pytest.param("", False, "", id="empty-is-not-read"),
    ],
)
def test_the_pause_is_read_as_the_policy_accepts_it(
    value: str | None, paused: bool, unknown: str | None
) -> None:
    annotations = {} if value is None else {ROLLOUT_PAUSE: value}
    assert Actions.from_annotations(annotations).paused is paused
    assert unknown_pause(annotations) == unknown


def passes(values: list[str | None]) -> list[tuple[str, str, str]]:
    """One pass per rollout-pause value (None: absent), each observing the conditions the pass
    before wrote; per pass (condition status, reason, the reasons of the Events it posts)."""
    observed = Observed()
    seen: list[tuple[str, str, str]] = []
    for value in values:
        service = load("unified")
        if value is not None:
            metadata = {**service.metadata, "annotations": {ROLLOUT_PAUSE: value}}
            service = service.model_copy(update={"metadata": metadata})
        plan = desired(service, observed, SETTINGS, NOW)
        wire = plan.status["conditions"]
        assert isinstance(wire, list)
        conditions = tuple(Condition.model_validate(c) for c in wire)
        found = [c for c in conditions if c.type == "RolloutAnnotationUnknown"]
        said = ",".join(e.reason for e in plan.events
                        if e.reason in ("UnknownPauseValue", "AnnotationsUnderstood"))  # fmt: skip
        seen.append((found[0].status.value, found[0].reason, said) if found else ("", "", said))
        observed = replace(observed, conditions=conditions)
    return seen


UNKNOWN = ("True", "UnknownPauseValue")
UNDERSTOOD = ("False", "AnnotationsUnderstood")


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param([None, "true", "false"], [("", "", "")] * 3, id="read-values-no-condition"),
        pytest.param(["True", "True", "True"],
                     [(*UNKNOWN, "UnknownPauseValue"), (*UNKNOWN, ""), (*UNKNOWN, "")],
                     id="unknown-said-once"),
        pytest.param(["yes", "true", "true"],
                     [(*UNKNOWN, "UnknownPauseValue"), (*UNDERSTOOD, "AnnotationsUnderstood"),
                      (*UNDERSTOOD, "")],
                     id="fixed-said-once"),
        pytest.param(["yes", None, "1"],
                     [(*UNKNOWN, "UnknownPauseValue"), (*UNDERSTOOD, "AnnotationsUnderstood"),
                      (*UNKNOWN, "UnknownPauseValue")],
                     id="removed-then-another-unknown"),
    ],
)  # fmt: skip
def test_an_unknown_pause_value_is_said_once_per_change(
    values: list[str | None], expected: list[tuple[str, str, str]]
) -> None:
    assert passes(values) == expected


def test_the_message_names_the_value_and_what_to_write() -> None:
    service = load("unified")
    metadata = {**service.metadata, "annotations": {ROLLOUT_PAUSE: "True"}}
    plan = desired(service.model_copy(update={"metadata": metadata}), Observed(), SETTINGS, NOW)
    wire = plan.status["conditions"]
    assert isinstance(wire, list)
    [condition] = [c for c in wire if c["type"] == "RolloutAnnotationUnknown"]
    assert "'True'" in condition["message"]
    assert 'Write "true"' in condition["message"]
    assert "not paused" in condition["message"]
