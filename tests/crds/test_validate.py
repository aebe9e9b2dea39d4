"""`llmfleet validate FILE…`: the samples pass (exit 0), every invalid case fails (exit 1) with
one line `FILE:DOC: field: message` naming its field in a person's words; multi-document
files, stdin, other kinds, YAML errors and unreadable files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from llmfleet.crds import kubectl_yaml
from tests.crds.cases import BASE, CASES, SAMPLES, VALID_AT_THE_EDGE, YAML_DIALECT, Case

LLMFLEET = Path(sys.executable).parent / "llmfleet"


def validate(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LLMFLEET), "validate", *args],
        input=stdin, capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip


def test_the_samples_are_valid() -> None:
    result = validate(*map(str, SAMPLES))
    assert result.returncode == 0, result.stdout
    assert result.stdout == ""
    assert f"{len(SAMPLES)} InferenceService(s) in {len(SAMPLES)} file(s): all valid" in (
        result.stderr
    )


def test_manifests_just_inside_the_rules_are_valid() -> None:
    stream = kubectl_yaml.dump_all(VALID_AT_THE_EDGE.values())
    result = validate("-", stdin=stream)
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_an_invalid_case_fails_naming_its_field(case: Case, tmp_path: Path) -> None:
    path = tmp_path / f"{case.id}.yaml"
    path.write_text(case.yaml())
    result = validate(str(path))
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    said = case.message or case.validate_says
    assert any(line.startswith(f"{path}:1: {case.field}") and said in line for line in lines), lines


def test_documents_are_counted_and_other_kinds_skipped(tmp_path: Path) -> None:
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}
    bad = CASES[0]
    path = tmp_path / "all.yaml"
    path.write_text(
        yaml.safe_dump_all([BASE, config_map, None, bad.manifest()], explicit_start=True)
    )
    result = validate(str(path), "-", stdin=yaml.safe_dump(bad.manifest()))
    assert result.returncode == 1
    assert [line.split(": ")[:2] for line in result.stdout.splitlines()] == [
        [f"{path}:4", bad.field],
        ["-:1", bad.field],
    ]
    assert "3 InferenceService(s) in 2 file(s): 2 problem(s)" in result.stderr


def test_yaml_a_person_writes_reads_as_kubectl_reads_it(tmp_path: Path) -> None:
    """A date stays a string (PyYAML alone would make it a date, which is not a string)."""
    path = tmp_path / "dated.yaml"
    path.write_text(yaml.safe_dump(BASE).replace("model:\n", "model:\n    revision: 2024-06-01\n"))
    result = validate(str(path))
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("name", YAML_DIALECT)
def test_scalars_read_as_kubectl_reads_them(name: str, tmp_path: Path) -> None:
    """`4e3` is a number, `3:00` a string, `on` a boolean, `0755` octal (the cluster test
    checks the API server's verdict on the same texts)."""
    text, field = YAML_DIALECT[name]
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    result = validate(str(path))
    if field is None:
        assert result.returncode == 0, result.stdout
    else:
        assert result.returncode == 1
        assert result.stdout.startswith(f"{path}:1: {field}"), result.stdout


def test_a_yaml_error_and_a_missing_file_are_problems(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    first_document = yaml.safe_dump(BASE)
    path.write_text(first_document + "---\nspec: [\n")
    result = validate(str(path), str(tmp_path / "absent.yaml"))
    assert result.returncode == 1
    first, second = result.stdout.splitlines()
    assert first.startswith(f"{path}:2: (yaml): ")
    # The stream ends inside the list: the line after `spec: [`, counted over the whole file.
    assert f"(line {len(first_document.splitlines()) + 3}, column 1)" in first
    assert second.startswith(f"{tmp_path / 'absent.yaml'}: (file): cannot read")
