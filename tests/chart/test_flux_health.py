"""The Flux health check for InferenceService (charts/llmfleet/files/flux/kustomization-health.yaml:
`spec.healthCheckExprs`) on the Argo CD check's sample objects, evaluated as Flux's
kustomize-controller does (RFC-0009, Flux 2.5): in progress while status.observedGeneration
differs from metadata.generation; else inProgress, failed, current in that order, the first true
wins, none is in progress. The CEL is run by cel-python (Flux runs cel-go: the same language;
these expressions use only field access, `exists`, `==`, `&&` and `||`)."""

from __future__ import annotations

from typing import Any

import celpy
import pytest
import yaml

from tests.chart.monitoring import FILES
from tests.chart.test_argocd_health import CASES

SNIPPET = FILES / "flux" / "kustomization-health.yaml"


def _check() -> dict[str, str]:
    (check,) = yaml.safe_load(SNIPPET.read_text())["spec"]["healthCheckExprs"]
    assert (check["apiVersion"], check["kind"]) == ("llmfleet.dev/v1alpha1", "InferenceService")
    return check


def flux_health(obj: dict[str, Any]) -> str:
    """InProgress, Failed or Current as Flux computes it; Error when an expression cannot be
    evaluated on the object (no status yet)."""
    observed = obj.get("status", {}).get("observedGeneration")
    if observed is not None and observed != obj["metadata"].get("generation"):
        return "InProgress"
    environment = celpy.Environment()
    activation = {key: celpy.json_to_cel(value) for key, value in obj.items()}
    check = _check()
    for field, result in (
        ("inProgress", "InProgress"),
        ("failed", "Failed"),
        ("current", "Current"),
    ):
        if field not in check:
            continue
        try:
            value = environment.program(environment.compile(check[field])).evaluate(activation)
        except celpy.CELEvalError:
            return "Error"
        if value:
            return result
    return "InProgress"


ARGO_TO_FLUX = {"Healthy": "Current", "Degraded": "Failed", "Progressing": "InProgress"}
DIFFERENT = {
    "just applied, no status": "Error",
    "scaled to zero": "Current",
    "canary paused": "InProgress",
    "invalid spec without a generation": "InProgress",
    "conditions without observedGeneration": "Current",
}
"""Where Flux's answer is not Argo CD's: Flux cannot evaluate an object without status (the
operator writes one in its first pass), has no Suspended (scaled to zero on purpose is current, a
paused canary is not done), and compares observedGeneration before any expression but only when
status has one (the operator always writes it with conditions; its own invalid-spec status,
written without it, leaves the old one behind: see README)."""


@pytest.mark.parametrize(("obj", "argo"), CASES)
def test_flux_health(request: pytest.FixtureRequest, obj: dict[str, Any], argo: tuple) -> None:
    case = request.node.callspec.id
    expected = DIFFERENT.get(case) or ARGO_TO_FLUX[argo[0]]
    assert flux_health(obj) == expected


def test_every_expression_compiles_and_a_wrong_one_is_caught() -> None:
    environment = celpy.Environment()
    for field in ("inProgress", "failed", "current"):
        environment.compile(_check()[field])
    with pytest.raises(celpy.CELParseError):
        environment.compile("status.conditions.exists(c, c.type == 'Ready' &&)")
