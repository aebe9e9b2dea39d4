"""The API models: samples parse, defaults apply, every invalid case is refused in Python with
the same words the API server uses for our rules (written once, see `_base.Rule`) and with a
person's words for the schema's refusals, naming the field (`validation.problems`, what
`llmfleet validate` prints); manifests just inside the rules pass."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from llmfleet.crds import InferenceService, Mode
from llmfleet.crds._base import ADMISSION
from llmfleet.crds.spec import GpuType
from llmfleet.crds.validation import problems
from tests.crds.cases import BASE, CASES, SAMPLES, VALID_AT_THE_EDGE, Case


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda path: path.stem)
def test_samples_parse(sample: Path) -> None:
    manifest = yaml.safe_load(sample.read_text())
    assert problems(manifest) == []
    service = InferenceService.model_validate(manifest)
    assert service.spec.pools()
    assert service.to_wire()["spec"]["model"] == manifest["spec"]["model"]


def test_there_are_samples_for_each_flavour() -> None:
    assert {path.stem for path in SAMPLES} >= {"unified", "disaggregated", "spares", "slo"}


def test_defaults_fill_an_almost_empty_spec() -> None:
    service = InferenceService.model_validate(
        {"metadata": {"name": "m"}, "spec": {"model": {"name": "org/model"}}}
    )
    spec = service.spec
    assert spec.topology.mode == Mode.UNIFIED
    assert spec.runtime.gpu.type == GpuType.H100
    assert spec.runtime.gpu.count == 1
    assert spec.runtime.prefix_caching is True
    assert spec.pools() == {"unified": spec.topology.unified or spec.pools()["unified"]}
    assert spec.pools()["unified"].replicas == 1
    assert spec.served_name == "org/model"


def test_disaggregated_pools_come_in_serving_order() -> None:
    service = InferenceService.model_validate(yaml.safe_load(
        (SAMPLES[0].parent / "disaggregated.yaml").read_text()))  # fmt: skip
    assert list(service.spec.pools()) == ["prefill", "decode"]
    assert service.spec.served_name == "llama-70b"


def test_the_base_of_the_invalid_cases_is_valid() -> None:
    InferenceService.model_validate(BASE)
    assert problems(BASE) == []


def test_there_are_at_least_twenty_invalid_cases() -> None:
    assert len(CASES) >= 20
    assert len({case.id for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_invalid_manifests_are_refused(case: Case) -> None:
    lines = [f"{problem.path}: {problem.message}" for problem in problems(case.manifest())]
    said = case.message or case.validate_says
    assert any(line.startswith(case.field) and said in line for line in lines), lines


@pytest.mark.parametrize("case", [case for case in CASES if case.message
                                  and not case.field.startswith("metadata.annotations")],
                         ids=lambda case: case.id)  # fmt: skip
def test_our_rules_refuse_in_the_models_themselves(case: Case) -> None:
    """The operator, gateway and autoscaler parse with the models: a rule holds there too
    (the annotations' rules are the admission policy's, not the models'), except a rule that
    ratchets: its field does nothing, and an object stored before the rule must still be read
    (admission's context runs it)."""
    if case.ratchets:
        InferenceService.model_validate(case.manifest())
        with pytest.raises(ValidationError, match=re.escape(case.message)):
            InferenceService.model_validate(case.manifest(), context={ADMISSION: True})
        return
    with pytest.raises(ValidationError, match=re.escape(case.message)):
        InferenceService.model_validate(case.manifest())


@pytest.mark.parametrize("name", VALID_AT_THE_EDGE)
def test_manifests_just_inside_the_rules_pass(name: str) -> None:
    assert problems(VALID_AT_THE_EDGE[name]) == []
    InferenceService.model_validate(VALID_AT_THE_EDGE[name])


def test_a_problem_names_every_broken_field_of_the_schema() -> None:
    manifest = CASES[0].manifest()  # no model name
    manifest["spec"]["topology"]["unified"]["replicas"] = "2"
    assert [problem.path for problem in problems(manifest)] == [
        "spec.model.name",
        "spec.topology.unified.replicas",
    ]


@pytest.mark.parametrize(
    ("document", "path", "said"),
    [
        pytest.param([1], "", "a manifest is a mapping of fields, not a list", id="a-list"),
        pytest.param({**BASE, "apiVersion": "llmfleet.dev/v1"}, "apiVersion",
                     "must be llmfleet.dev/v1alpha1", id="another-version"),
        pytest.param({**BASE, "metadata": {}}, "metadata.name", "required", id="no-name"),
        pytest.param({**BASE, "metadata": {"generateName": "llama-"}}, None, "",
                     id="generate-name"),
        pytest.param({**BASE, "status": {"serving": 3}}, None, "", id="status-is-ignored"),
        pytest.param({**BASE, "spec": {**BASE["spec"], "slo": {"ttftP95Ms": float("nan")}}}, "",
                     "not representable as JSON", id="nan"),
    ],
)  # fmt: skip
def test_what_only_a_manifest_gets_wrong(document: object, path: str | None, said: str) -> None:
    found = problems(document)
    if path is None:
        assert found == []
    else:
        assert [(problem.path, said in problem.message) for problem in found] == [(path, True)]
