"""Check InferenceService manifests as the API server would, and say what is wrong in a person's
words, naming the field (pure: no I/O; `llmfleet validate` reads the files).

A manifest is read as kubectl sends it (`kubectl_yaml`), its labels and annotations checked as
the API server checks any object's (`metadata`) and as our admission policy checks the rollout
annotations (`admission_policy`), and the models are validated as the API
server sees a manifest: its JSON, types strict (a string
is never a number or a boolean, `"30s"` is not 30), except that a whole number written as a
float (`2.0`) counts as an integer, as it does for the API server. The CEL rules run as their
Python twins, so a manifest that passes here passes admission, except for what only the cluster
knows (names already taken, quotas, webhooks).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from llmfleet.crds import admission_policy, kubectl_yaml
from llmfleet.crds import metadata as meta
from llmfleet.crds._base import ADMISSION, RULE_ERROR
from llmfleet.crds.inference_service import API_VERSION, GROUP, KIND, InferenceService


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a manifest."""

    path: str
    """The field, as the API server names it: `spec.topology.unified.replicas`,
    `spec.runtime.env[1].name`, `spec.topology.unified.nodeSelector[nvidia.com/gpu.product]`."""
    message: str


def is_inference_service(document: object) -> bool:
    """True for a manifest of our kind (any version of our group: a wrong version is a problem
    to report, not another kind of object)."""
    return (
        isinstance(document, dict)
        and document.get("kind") == KIND
        and str(document.get("apiVersion", "")).split("/")[0] == GROUP
    )


def problems(document: object) -> list[Problem]:
    """What the API server would refuse in one InferenceService manifest ([]: nothing)."""
    if not isinstance(document, dict):
        return [Problem("", f"a manifest is a mapping of fields, not {_kind_of(document)}")]
    found: list[Problem] = []
    if document.get("apiVersion") != API_VERSION:
        found.append(Problem("apiVersion", f"must be {API_VERSION}, the version llmfleet serves"))
    metadata = document.get("metadata")
    if isinstance(metadata, dict) and not (metadata.get("name") or metadata.get("generateName")):
        found.append(Problem("metadata.name", "required: every InferenceService has a name"))
    found += [Problem(path, message) for path, message in meta.problems(metadata)]
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    if isinstance(annotations, dict):
        found += [
            Problem(path, message) for path, message in admission_policy.problems(annotations)
        ]
    # The API server ignores `status` in a manifest (the status subresource owns it).
    manifest = {key: value for key, value in document.items() if key != "status"}
    try:
        body = json.dumps(_integers(manifest), allow_nan=False)
    except (TypeError, ValueError) as error:
        return [*found, Problem("", f"not representable as JSON: {error}")]
    try:
        InferenceService.model_validate_json(body, strict=True, context={ADMISSION: True})
    except ValidationError as error:
        found += [_problem(detail) for detail in error.errors(include_url=False)]
    return found


def _integers(value: Any) -> Any:
    """The document with every whole-number float as an int, as the API server decodes JSON."""
    if isinstance(value, dict):
        return {key: _integers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_integers(item) for item in value]
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


def _path(location: tuple[int | str, ...], field_path: str = "") -> str:
    text = ""
    for part in location:
        if isinstance(part, int):
            text += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", part):
            text += f".{part}"
        else:  # a map key such as nvidia.com/gpu.product
            text += f"[{part}]"
    # A rule's fieldPath is relative CEL-ish JSONPath: `.a.b` or `.a['k']`.
    text += re.sub(r"\['([^']*)'\]", r"[\1]", field_path)
    return text.lstrip(".")


_UNIT = re.compile(r"^\s*-?\d+(\.\d+)?\s*(ms|s|m|h|d|Gi|Mi|%)\s*$")


def _problem(detail: ErrorDetails) -> Problem:
    """One pydantic error in a person's words."""
    kind, given, context = detail["type"], detail.get("input"), detail.get("ctx") or {}
    location = tuple(part for part in detail["loc"] if not str(part).startswith("function-"))
    if kind == RULE_ERROR:
        return Problem(_path(location, context.get("field_path") or ""), detail["msg"])
    shown = _shown(given)
    messages = {
        "missing": "required",
        "extra_forbidden": "unknown field: check its spelling and where it sits (see docs/api.md)",
        "int_type": f"must be a whole number, not {shown}",
        "float_type": f"must be a number, not {shown}",
        "bool_type": f"must be true or false, not {shown}",
        "string_type": f"must be a string, not {shown} (quote it in YAML)",
        "list_type": f"must be a list, not {shown}",
        "dict_type": f"must be a mapping of fields, not {shown}",
        "model_type": f"must be a mapping of fields, not {shown}",
        "model_attributes_type": f"must be a mapping of fields, not {shown}",
        "enum": f"must be one of {context.get('expected', '')}, not {shown}",
        "greater_than_equal": f"must be at least {context.get('ge')}, not {shown}",
        "greater_than": f"must be more than {context.get('gt')}, not {shown}",
        "less_than_equal": f"must be at most {context.get('le')}, not {shown}",
        "less_than": f"must be less than {context.get('lt')}, not {shown}",
        "string_pattern_mismatch": f"{shown} does not match {context.get('pattern')}",
        "string_too_short": f"must have at least {context.get('min_length')} character(s)",
        "string_too_long": f"must have at most {context.get('max_length')} characters, "
        f"not {len(given) if isinstance(given, str) else '?'}",
        "too_short": f"must have at least {context.get('min_length')} item(s)",
        "too_long": f"must have at most {context.get('max_length')} items",
    }
    message = messages.get(kind, detail["msg"])
    if kind in ("int_type", "float_type") and isinstance(given, str) and _UNIT.match(given):
        message += ": write the number alone, the unit is in the field's name"
    elif kind == "value_error":
        message = detail["msg"].removeprefix("Value error, ")
    return Problem(_path(location), message)


def _shown(value: object) -> str:
    """A value as a person wrote it in YAML, with its kind where that is the point."""
    if isinstance(value, str):
        return f"the string {json.dumps(value)}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return str(value)


def _kind_of(value: object) -> str:
    return _shown(value) if isinstance(value, dict | list) else f"a {type(value).__name__}"


def documents(text: str) -> Iterator[tuple[int, object]]:
    """The documents of a YAML stream as kubectl sends them (`kubectl_yaml`), numbered from 1
    (an empty one is None). A YAML error is raised (`yaml.YAMLError`) when the reading reaches
    it, after the documents before it."""
    return kubectl_yaml.documents(text)


def yaml_error(error: yaml.YAMLError) -> str:
    """A YAML error in one line: what is wrong, and where."""
    if isinstance(error, yaml.MarkedYAMLError) and error.problem_mark is not None:
        mark = error.problem_mark
        return f"{error.problem} (line {mark.line + 1}, column {mark.column + 1})"
    return " ".join(str(error).split())
