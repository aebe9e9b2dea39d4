"""`llmfleet load --kubeconfig`: the SLO of the InferenceService serving the model, picked from
what the cluster lists."""

from __future__ import annotations

from typing import Any

import pytest

from llmfleet.autoscaler.sim.load.slo import service_slo
from llmfleet.autoscaler.sim.load.stats import Slo

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
MISTRAL = "mistralai/Mistral-7B-Instruct-v0.3"


def service(
    namespace: str, name: str, model: str, slo: dict[str, float] | None = None
) -> dict[str, Any]:
    """An InferenceService as the API server lists it (camelCase, with metadata)."""
    spec: dict[str, Any] = {
        "model": {"name": model},
        "runtime": {"gpu": {"type": "H100", "count": 1}},
        "topology": {"unified": {"replicas": 1}},
    }
    if slo is not None:
        spec["slo"] = slo
    return {
        "apiVersion": "llmfleet.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"namespace": namespace, "name": name},
        "spec": spec,
    }


ITEMS = [
    service("default", "llama-8b", LLAMA),
    service("default", "mistral-slo", MISTRAL, {"ttftP95Ms": 400, "itlP95Ms": 40}),
]


@pytest.mark.parametrize(
    ("items", "model", "found"),
    [
        pytest.param(
            ITEMS,
            MISTRAL,
            ("default/mistral-slo", Slo(400.0, 40.0)),
            id="service-with-an-slo",
        ),
        pytest.param(
            ITEMS,
            LLAMA,
            ("default/llama-8b", Slo()),
            id="service-without-one",
        ),
        pytest.param(ITEMS, "gpt-4o", None, id="no-service-serves-it"),
        pytest.param(
            [{"metadata": {"namespace": "a", "name": "broken"}, "spec": {"model": {}}}, *ITEMS],
            MISTRAL,
            ("default/mistral-slo", Slo(400.0, 40.0)),
            id="an-invalid-spec-is-skipped",
        ),
        pytest.param(
            [
                service("b", "m", MISTRAL, {"ttftP95Ms": 100}),
                service("a", "m", MISTRAL, {"ttftP95Ms": 200}),
            ],
            MISTRAL,
            ("a/m", Slo(200.0, None)),
            id="first-by-namespace",
        ),
    ],
)
def test_the_service_serving_the_model(
    items: list[dict[str, Any]], model: str, found: tuple[str, Slo] | None
) -> None:
    assert service_slo(items, model) == found


def test_the_served_name_wins_over_the_model_name() -> None:
    item = service("default", "llama-8b", LLAMA, {"ttftP95Ms": 250})
    item["spec"]["model"]["servedName"] = "llama"
    assert service_slo([item], "llama") == ("default/llama-8b", Slo(250.0, None))
    assert service_slo([item], LLAMA) is None
