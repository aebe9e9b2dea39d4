"""The name limit leaves room for every child: a service named at the limit gets children whose
names are DNS-1035 labels of at most 63 characters, in both modes, each named by one of the
suffixes the limit is computed from (the operator's own plan decides the names)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from llmfleet.crds import InferenceService, labels
from llmfleet.operator.observed import Observed
from llmfleet.operator.plan import desired
from llmfleet.operator.settings import OperatorSettings
from tests.crds.cases import DISAGGREGATED, changed

LONGEST = "l" + "x" * (labels.SERVICE_NAME_MAX_LENGTH - 1)


@pytest.mark.parametrize(
    "topology",
    [pytest.param({"mode": "Unified"}, id="unified"), pytest.param(DISAGGREGATED, id="pd")],
)
def test_children_of_a_service_named_at_the_limit_have_valid_names(
    topology: dict[str, object],
) -> None:
    manifest = changed({"metadata.name": LONGEST, "topology": topology})
    manifest["metadata"] |= {"namespace": "default", "uid": "u-1", "generation": 1}
    service = InferenceService.model_validate(manifest)
    plan = desired(
        service,
        Observed(service_monitor_crd=True),
        OperatorSettings(),
        datetime(2026, 1, 1, tzinfo=UTC),
    )
    names = {child["metadata"]["name"] for child in plan.objects}
    # Every child is named by a suffix the limit was computed from.
    assert {name.removeprefix(f"{LONGEST}-") for name in names} <= set(labels.CHILD_SUFFIXES)
    assert max(map(len, names)) == labels.DNS_LABEL_MAX_LENGTH
    for name in names:
        assert re.fullmatch(labels.SERVICE_NAME_PATTERN, name), name


def test_a_name_one_longer_is_refused() -> None:
    with pytest.raises(ValueError, match=r"metadata\.name must be at most"):
        InferenceService.model_validate(changed({"metadata.name": LONGEST + "x"}))
