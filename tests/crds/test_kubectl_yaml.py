"""YAML read as kubectl reads it: each plain scalar below was decoded by kubectl v1.32 (client
side, into a ConfigMap's annotation: a string passes, a number or a boolean is refused, `.inf`
cannot become JSON), and `kubectl_yaml.scalar` must agree, value and kind."""

from __future__ import annotations

import math

import pytest
import yaml

from llmfleet.crds.kubectl_yaml import documents, dump, scalar
from tests.crds.cases import CASES, VALID_AT_THE_EDGE

READ_AS = [
    # YAML 1.1's booleans, which YAML 1.2 reads as strings: go-yaml v2 keeps them booleans.
    ("on", True), ("yes", True), ("y", True), ("TRUE", True), ("True", True),
    ("off", False), ("No", False),
    # Numbers PyYAML (YAML 1.1) reads as strings.
    ("4e3", 4000.0), ("1e3", 1000.0), ("1.", 1.0), ("08", 8.0),
    # Go's integer syntax: octal with a leading 0, prefixes, underscores anywhere.
    ("0755", 493), ("0o755", 493), ("0x1F", 31), ("0b11", 3), ("1_000", 1000), ("1__0", 10),
    ("+12", 12), ("-0", 0), (".5", 0.5),
    # Strings PyYAML reads as numbers or dates: no sexagesimal, no timestamps.
    ("3:00", "3:00"), ("12:30:00", "12:30:00"), ("2024-01-01", "2024-01-01"), ("_1", "_1"),
    # Nulls.
    ("~", None), ("Null", None),
    # Past int64: unsigned, then a float; past float64: a string (Go's ParseFloat fails).
    ("18446744073709551615", 2**64 - 1), ("100000000000000000000", 1e20), ("1e400", "1e400"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "value"), READ_AS, ids=[text for text, _ in READ_AS])
def test_a_plain_scalar_reads_as_kubectl_reads_it(text: str, value: object) -> None:
    read = scalar(text)
    assert (type(read), read) == (type(value), value)


def test_infinity_is_a_float_json_cannot_carry() -> None:
    read = scalar(".inf")
    assert isinstance(read, float)
    assert math.isinf(read)


def test_quoted_scalars_stay_strings_and_keys_become_text() -> None:
    [(number, document)] = documents("a: 'on'\nb: \"4e3\"\n1: x\non: z\n<<: {c: 1}\n")
    assert number == 1
    assert document == {"a": "on", "b": "4e3", "1": "x", "true": "z", "c": 1}


# Strings whose plain spelling kubectl reads as something else; PyYAML writes the first four
# plain (YAML 1.1 reads them as strings), so a table row holding one reached the API server as
# a number or a boolean.
NOT_PLAIN = ["08192", "4e3", "1.", "0o17", "on", "y", "0x1F", "1_000", "~", ".inf", ""]


@pytest.mark.parametrize("text", NOT_PLAIN)
def test_a_string_kubectl_would_read_as_another_type_is_quoted(text: str) -> None:
    [(_, document)] = documents(dump({"words": [text], text: "key"}))
    assert document == {"words": [text], text: "key"}


def test_pyyaml_alone_writes_strings_kubectl_reads_as_numbers() -> None:
    """Why the tables dump with `kubectl_yaml.dump`: `yaml.safe_dump` writes `08192` plain."""
    [(_, document)] = documents(yaml.safe_dump({"words": ["08192", "4e3"]}))
    assert document == {"words": [8192.0, 4000.0]}


ALL_MANIFESTS = [
    *(pytest.param(case.manifest(), id=case.id) for case in CASES),
    *(pytest.param(manifest, id=f"valid-{name}") for name, manifest in VALID_AT_THE_EDGE.items()),
]


def _kinds(value: object) -> object:
    """`value` as JSON carries it to the API server: every number a float (10**20 reads as
    1e20, past what an integer holds), strings, booleans and nulls as they are."""
    if isinstance(value, dict):
        return {key: _kinds(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_kinds(item) for item in value]
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return value


@pytest.mark.parametrize("manifest", ALL_MANIFESTS)
def test_every_table_manifest_reads_back_as_written(manifest: object) -> None:
    """What the cluster tests send is the table's manifest: each string a string, each number
    the number, each boolean the boolean."""
    [(_, document)] = documents(dump(manifest))
    assert _kinds(document) == _kinds(manifest)
