"""The rendered InferenceService CRD on the real API server: samples and manifests just inside
the rules apply, invalid manifests are refused at admission with a message naming the field (our
rule's words, or the API server's own for the schema's refusals), and `kubectl get llmsvc` has
columns."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from llmfleet.crds import render, validation
from tests.cluster.kube import Kube
from tests.crds.cases import BASE, CASES, SAMPLES, VALID_AT_THE_EDGE, YAML_DIALECT, Case

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def namespace(kube: Kube) -> Iterator[str]:
    """One namespace for the module: these tests create no pods, so they can share it."""
    kube.kubectl("apply", "--server-side", "--field-manager=llmfleet-tests", "-f",
                 str(render.CRD_FILE))  # fmt: skip
    # NOTE: right after a changed CRD is applied its conditions may not be there yet (`kubectl
    # wait` then fails instead of waiting), and a session started right after another finds
    # the namespace still terminating: both are waited for.
    established = '{.status.conditions[?(@.type=="Established")].status}'
    kube.wait_for(lambda: kube.run("get", f"crd/{render.CRD_NAME}", "-o",
                                   f"jsonpath={established}").stdout == "True",
                  timeout=30, what="the CRD to be established")  # fmt: skip
    kube.wait_for(lambda: kube.run("create", "namespace", "crd-tests").returncode == 0
                  or kube.run("get", "namespace", "crd-tests", "-o",
                              "jsonpath={.status.phase}").stdout == "Active",
                  timeout=120, what="namespace crd-tests")  # fmt: skip
    yield "crd-tests"
    kube.kubectl("delete", "namespace", "crd-tests", "--wait=false")


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda path: path.stem)
def test_sample_applies(kube: Kube, namespace: str, sample: Path) -> None:
    kube.kubectl("apply", "--server-side", "-n", namespace, "-f", str(sample))
    listing = kube.kubectl("get", "llmsvc", "-n", namespace)
    header = listing.splitlines()[0].split()
    assert header == ["NAME", "MODE", "READY", "SERVING", "CANARY", "ENDPOINT", "AGE"]
    name = yaml.safe_load(sample.read_text())["metadata"]["name"]
    stored = kube.get(f"inferenceservices.llmfleet.dev/{name}", "-n", namespace)
    # Defaults are applied by the API server from the rendered schema.
    assert stored["spec"]["runtime"]["prefixCaching"] is True
    assert stored["spec"]["topology"]["mode"] in ("Unified", "Disaggregated")
    wide = kube.kubectl("get", "llmsvc", "-n", namespace, "-o", "wide").splitlines()[0].split()
    assert wide[-3:] == ["REASON", "MODEL", "METRICS"]


def test_the_base_of_the_invalid_cases_is_accepted(kube: Kube, namespace: str) -> None:
    kube.kubectl("apply", "--server-side", "--dry-run=server", "-n", namespace, "-f", "-",
                 stdin=yaml.safe_dump(BASE))  # fmt: skip


@pytest.mark.parametrize("name", VALID_AT_THE_EDGE)
def test_a_manifest_just_inside_the_rules_is_accepted(
    kube: Kube, namespace: str, name: str
) -> None:
    kube.kubectl("apply", "--server-side", "--dry-run=server", "-n", namespace, "-f", "-",
                 stdin=yaml.safe_dump(VALID_AT_THE_EDGE[name]))  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_invalid_manifest_is_refused_naming_the_field(
    kube: Kube, namespace: str, case: Case
) -> None:
    result = kube.run("apply", "--server-side", "--dry-run=server", "-n", namespace, "-f", "-",
                      stdin=case.yaml())  # fmt: skip
    assert result.returncode != 0, f"{case.id} was accepted"
    print(f"{case.id}: {result.stderr.strip()}")
    assert case.field in result.stderr
    assert (case.message or case.api_says) in result.stderr


def _verdicts(kube: Kube, namespace: str, text: str) -> tuple[str, list[str]]:
    """(what the API server said, or "" when it accepted; `llmfleet validate`'s lines) for one
    manifest as kubectl reads it."""
    result = kube.run("apply", "--server-side", "--dry-run=server", "-n", namespace, "-f", "-",
                      stdin=text)  # fmt: skip
    lines = [
        f"{problem.path}: {problem.message}"
        for _, document in validation.documents(text)
        for problem in validation.problems(document)
    ]
    return ("" if result.returncode == 0 else result.stderr.strip() or "refused"), lines


CROSS_CHECKED = [
    *(pytest.param(sample.read_text(), None, id=f"sample-{sample.stem}") for sample in SAMPLES),
    *(pytest.param(yaml.safe_dump(m), None, id=f"valid-{n}") for n, m in VALID_AT_THE_EDGE.items()),
    *(pytest.param(case.yaml(), case.field, id=case.id) for case in CASES),
    *(pytest.param(text, field, id=f"yaml-{n}") for n, (text, field) in YAML_DIALECT.items()),
]


@pytest.mark.parametrize(("text", "field"), CROSS_CHECKED)
def test_validate_gives_the_api_servers_verdict(
    kube: Kube, namespace: str, text: str, field: str | None
) -> None:
    """`llmfleet validate` and a server-side dry run agree on every manifest of the tables: both
    accept it, or both refuse it naming the same field."""
    api_says, validate_says = _verdicts(kube, namespace, text)
    if field is None:
        assert (api_says, validate_says) == ("", [])
    else:
        assert field in api_says, api_says
        assert any(line.startswith(field) for line in validate_says), validate_says
