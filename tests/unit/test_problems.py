"""Validation errors said as `KEY.PATH: what is wrong`, one line each, with no model class names
and no documentation URL."""

from __future__ import annotations

from typing import Literal

import pytest
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llmfleet.core.problems import key_path, problems, yaml_problem


class _Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    size: int = Field(default=1, gt=0)
    mode: Literal["a", "b"] = "a"


class _Document(BaseModel):
    model_config = ConfigDict(extra="forbid")
    items: dict[str, _Inner]
    tags: list[str] = Field(default=[], max_length=2)


@pytest.mark.parametrize(
    ("loc", "path"),
    [
        pytest.param((), "", id="document"),
        pytest.param(("items",), "items", id="key"),
        pytest.param(("items", "x", "size"), "items.x.size", id="nested"),
        pytest.param(("tags", 0), "tags[0]", id="index"),
        pytest.param(("items", "org/model.v1", "size"), 'items["org/model.v1"].size', id="quoted"),
        pytest.param(("items", "has-dash_1"), "items.has-dash_1", id="dash"),
    ],
)
def test_key_path(loc: tuple[int | str, ...], path: str) -> None:
    assert key_path(loc) == path


@pytest.mark.parametrize(
    ("document", "lines"),
    [
        pytest.param({}, ["items: required"], id="missing"),
        pytest.param({"items": {}, "extra": 1}, ["extra: unknown key"], id="unknown-key"),
        pytest.param([], ["must be a mapping, got a list"], id="document-not-a-mapping"),
        pytest.param(
            {"items": {"x": 3}}, ["items.x: must be a mapping, got 3"], id="not-a-mapping"
        ),
        pytest.param(
            {"items": {"x": {"size": 0, "mode": "c"}}},
            [
                "items.x.size: must be greater than 0, got 0",
                "items.x.mode: must be one of 'a' or 'b', got 'c'",
            ],
            id="two-problems",
        ),
        pytest.param(
            {"items": {"x": {"size": "big"}}},
            ["items.x.size: must be an integer, got 'big'"],
            id="not-an-integer",
        ),
        pytest.param(
            {"items": {}, "tags": ["a", "b", "c"]},
            ["tags: must have at most 2 item(s), got 3"],
            id="too-long",
        ),
        pytest.param(
            {"items": {}, "tags": "a"}, ["tags: must be a list, got 'a'"], id="not-a-list"
        ),
    ],
)
def test_problems(document: object, lines: list[str]) -> None:
    with pytest.raises(ValidationError) as raised:
        _Document.model_validate(document)
    said = problems(raised.value)
    assert said == lines
    assert not any("_Document" in line or "_Inner" in line or "http" in line for line in said)


def test_yaml_problem_names_line_and_column() -> None:
    with pytest.raises(yaml.YAMLError) as raised:
        yaml.safe_load("a: 1\nb: [2\n")
    assert yaml_problem(raised.value) == (
        "line 3, column 1: not YAML: expected ',' or ']', but got '<stream end>'"
    )
