"""Two services claiming one model name (issue 28): the condition `ModelNameConflict` on each
claimant's status, and one Event per change, not one per pass (pure: `plan.desired` over a
sequence of passes, each observing the conditions the last one wrote)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from llmfleet.crds import Condition
from llmfleet.operator.observed import Observed
from llmfleet.operator.plan import desired
from tests.operator.test_plan import NOW, SETTINGS, load

ME = ("team", "llama-8b")  # the unified sample, as `load` names it
OTHER = ("team", "llama-copy")
THIRD = ("prod", "llama-old")


def passes(claims_per_pass: list[tuple[tuple[str, str], ...]]) -> list[tuple[str, str, str]]:
    """Run one pass per entry, each observing the conditions the pass before wrote; per pass
    (condition status, reason, the reasons of the Events it posts)."""
    service = load("unified")
    observed = Observed()
    seen: list[tuple[str, str, str]] = []
    for claims in claims_per_pass:
        plan = desired(service, replace(observed, model_claims=claims), SETTINGS, NOW)
        wire = plan.status["conditions"]
        assert isinstance(wire, list)
        conditions = tuple(Condition.model_validate(c) for c in wire)
        found = [c for c in conditions if c.type == "ModelNameConflict"]
        said = ",".join(e.reason for e in plan.events if e.reason.startswith("ModelName"))
        seen.append((found[0].status.value, found[0].reason, said) if found else ("", "", said))
        observed = replace(observed, conditions=conditions)
    return seen


@pytest.mark.parametrize(
    ("claims", "expected"),
    [
        pytest.param([(ME,), (ME,)], [("", "", ""), ("", "", "")], id="alone-no-condition"),
        pytest.param(
            [(ME, OTHER), (ME, OTHER), (ME, OTHER)],
            [("True", "ModelNameShared", "ModelNameShared"), ("True", "ModelNameShared", ""),
             ("True", "ModelNameShared", "")],
            id="created-first-said-once",
        ),
        pytest.param(
            [(THIRD, ME), (THIRD, ME)],
            [("True", "ModelNameTaken", "ModelNameTaken"), ("True", "ModelNameTaken", "")],
            id="created-later-said-once",
        ),
        pytest.param(
            [(ME, OTHER), (ME,), (ME,)],
            [("True", "ModelNameShared", "ModelNameShared"),
             ("False", "ModelNameUnique", "ModelNameUnique"), ("False", "ModelNameUnique", "")],
            id="resolved-said-once",
        ),
        pytest.param(
            [(ME, OTHER), (THIRD, ME, OTHER)],
            [("True", "ModelNameShared", "ModelNameShared"),
             ("True", "ModelNameTaken", "ModelNameTaken")],
            id="an-older-claimant-arrives",
        ),
    ],
)  # fmt: skip
def test_a_conflict_is_on_the_status_and_said_once_per_change(
    claims: list[tuple[tuple[str, str], ...]], expected: list[tuple[str, str, str]]
) -> None:
    assert passes(claims) == expected


def test_the_messages_name_the_other_claimants_and_who_gets_the_name() -> None:
    service = load("unified")
    model = service.spec.served_name

    def message(claims: tuple[tuple[str, str], ...]) -> tuple[str, bool]:
        plan = desired(service, Observed(model_claims=claims), SETTINGS, NOW)
        wire = plan.status["conditions"]
        assert isinstance(wire, list)
        (found,) = [c for c in wire if c["type"] == "ModelNameConflict"]
        (event,) = [e for e in plan.events if e.reason == found["reason"]]
        return found["message"], event.warning

    shared, warned = message((ME, OTHER))
    assert warned
    assert shared.startswith(f"team/llama-copy also claim(s) the model name {model!r}")
    assert "routes it to this service" in shared
    taken, warned = message((THIRD, ME, OTHER))
    assert warned
    assert taken.startswith(
        f"The model name {model!r} is claimed by prod/llama-old, team/llama-copy"
    )
    assert "the gateway routes it to prod/llama-old" in taken
