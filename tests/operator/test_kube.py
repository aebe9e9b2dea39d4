"""kube.py's pure parts: the apply body. (Against the real API server: tests/cluster.)"""

from __future__ import annotations

import json

import pytest

from llmfleet.operator.kube import apply_body


@pytest.mark.parametrize(
    ("text", "written"),
    [
        pytest.param("🚀", "🚀".encode(), id="emoji-as-utf8-not-a-surrogate-pair"),
        pytest.param("\U0001d518", "\U0001d518".encode(), id="mathematical-letter-as-utf8"),
        pytest.param("é", b"\\u00e9", id="latin-1-escaped"),
        pytest.param("中", b"\\u4e2d", id="cjk-escaped"),
        pytest.param("\u2028", b"\\u2028", id="line-separator-escaped-yaml-folds-it"),
        pytest.param("\x85", b"\\u0085", id="next-line-escaped-yaml-folds-it"),
        pytest.param("\x7f", b"\\u007f", id="delete-escaped-yaml-refuses-it"),
        pytest.param("\x9b", b"\\u009b", id="c1-control-escaped-yaml-refuses-it"),
        pytest.param("\uffff", b"\\uffff", id="non-character-escaped-yaml-refuses-it"),
        pytest.param("\x01", b"\\u0001", id="c0-control-escaped"),
        pytest.param('a"\\b', b'a\\"\\\\b', id="json-escapes-kept"),
    ],
)  # fmt: skip
def test_apply_body_writes_each_character_as_yaml_and_json_read_it(
    text: str, written: bytes
) -> None:
    manifest = {"data": {"key": f"<{text}>"}}
    body = apply_body(manifest)
    assert b"<" + written + b">" in body
    assert json.loads(body) == manifest
    assert b"\\ud8" not in body  # no surrogate escapes, ever
    assert b"\\udb" not in body
