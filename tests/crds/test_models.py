"""The API models: samples parse, defaults apply, and every invalid case is refused in Python
with the same words the API server uses (the rules are written once, see `_base.Rule`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from llmfleet.crds import InferenceService, Mode
from llmfleet.crds.spec import GpuType
from tests.crds.cases import BASE, CASES, SAMPLES, Case


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda path: path.stem)
def test_samples_parse(sample: Path) -> None:
    manifest = yaml.safe_load(sample.read_text())
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


def test_there_are_at_least_twenty_invalid_cases() -> None:
    assert len(CASES) >= 20
    assert len({case.id for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_invalid_manifests_are_refused(case: Case) -> None:
    with pytest.raises(ValidationError) as caught:
        InferenceService.model_validate(case.manifest())
    text = str(caught.value)
    if case.message:
        assert case.message in text
    else:
        # Schema errors: pydantic names the field by its wire path, as the API server does.
        leaf = case.field.rsplit(".", 1)[-1].split("[")[0]
        assert leaf in text
