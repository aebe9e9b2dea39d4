"""YAML read as kubectl reads it: each plain scalar below was decoded by kubectl v1.32 (client
side, into a ConfigMap's annotation: a string passes, a number or a boolean is refused, `.inf`
cannot become JSON), and `kubectl_yaml.scalar` must agree, value and kind."""

from __future__ import annotations

import math

import pytest

from llmfleet.crds.kubectl_yaml import documents, scalar

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
