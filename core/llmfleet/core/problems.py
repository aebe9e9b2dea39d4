"""A configuration document's problems, one line each, naming the key path as a person wrote it.

pydantic's own rendering of a `ValidationError` names the internal model classes, repeats the
input and ends in a documentation URL. Files a person writes (the gateway's static config, its
API keys file) are checked by pydantic models too, but their errors are said the way the API
server says an `InferenceService`'s (`llmfleet crds`): `KEY.PATH: what is wrong`, e.g.
`models.llama.unified[0]: not a URL (relative URL without a base): 'localhost:8000'`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails

_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def key_path(loc: Sequence[int | str]) -> str:
    """`('models', 'm', 'unified', 0)` -> `models.m.unified[0]`; a key that is not a plain word
    is quoted: `models["meta-llama/Llama-3.1-8B"]`."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif _PLAIN_KEY.fullmatch(part):
            path += f".{part}" if path else part
        else:
            path += f"[{json.dumps(part)}]"
    return path


def problems(error: ValidationError) -> list[str]:
    """One line per problem: `KEY.PATH: what is wrong`, or only what is wrong for the whole
    document."""
    lines = []
    for detail in error.errors():
        where = key_path(detail["loc"])
        what = describe(detail)
        lines.append(f"{where}: {what}" if where else what)
    return lines


def yaml_problem(error: yaml.YAMLError) -> str:
    """A YAML syntax error as one line: `line L, column C: not YAML: what the parser says`."""
    if isinstance(error, yaml.MarkedYAMLError) and error.problem_mark is not None:
        mark = error.problem_mark
        return f"line {mark.line + 1}, column {mark.column + 1}: not YAML: {error.problem}"
    return f"not YAML: {' '.join(str(error).split())}"


def describe(detail: ErrorDetails) -> str:
    """What is wrong with one value, without where it is."""
    kind, ctx, value = detail["type"], detail.get("ctx") or {}, detail.get("input")
    if kind in ("value_error", "assertion_error") and "error" in ctx:
        return str(ctx["error"])
    words = _WORDS.get(kind)
    if words is not None:
        try:
            return words.format(**ctx, got=_shown(value))
        except KeyError:  # a context without the figure the words need: pydantic's own
            pass
    message = detail["msg"]
    return f"{message[:1].lower()}{message[1:]}, got {_shown(value)}"


def _shown(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return repr(value)


_WORDS = {
    "missing": "required",
    "extra_forbidden": "unknown key",
    "model_type": "must be a mapping, got {got}",
    "model_attributes_type": "must be a mapping, got {got}",
    "dict_type": "must be a mapping, got {got}",
    "list_type": "must be a list, got {got}",
    "string_type": "must be a string, got {got}",
    "int_type": "must be an integer, got {got}",
    "int_parsing": "must be an integer, got {got}",
    "int_from_float": "must be an integer, got {got}",
    "float_type": "must be a number, got {got}",
    "float_parsing": "must be a number, got {got}",
    "bool_type": "must be true or false, got {got}",
    "bool_parsing": "must be true or false, got {got}",
    "greater_than": "must be greater than {gt}, got {got}",
    "greater_than_equal": "must be at least {ge}, got {got}",
    "less_than": "must be less than {lt}, got {got}",
    "less_than_equal": "must be at most {le}, got {got}",
    "too_short": "must have at least {min_length} item(s), got {actual_length}",
    "too_long": "must have at most {max_length} item(s), got {actual_length}",
    "string_too_short": "must be at least {min_length} character(s) long",
    "literal_error": "must be one of {expected}, got {got}",
    "enum": "must be one of {expected}, got {got}",
    "url_type": "must be a URL, got {got}",
    "url_parsing": "not a URL ({error}): {got}",
    "url_scheme": "the URL's scheme must be {expected_schemes}, got {got}",
}
"""How each pydantic error type is said; `{got}` is the value found, the others come from the
error's context. A type not listed falls back on pydantic's own message (which names no class)."""
