"""What the API server checks in any object's labels and annotations, in a person's words (pure).

The CRD cannot declare these (its schema may describe only `metadata.name`); the API server checks
them for every object, with the rules below (apimachinery's `ValidateLabels` and
`ValidateAnnotations`). `llmfleet validate` runs them so that it refuses what the API server
refuses; the rollout annotations (`llmfleet.dev/rollout-*`) are plain annotations there.
"""

from __future__ import annotations

import json
import re

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_PREFIX = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
QUALIFIED_NAME = re.compile(rf"({_PREFIX}/)?{_NAME}")
"""A label or annotation key: an optional DNS-subdomain prefix (253 characters at most) and
`/`, then a name of at most 63."""
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?")
ANNOTATIONS_MAX_BYTES = 256 * 1024
"""Keys and values of all annotations together (UTF-8 bytes)."""

_KEY = (
    "not a valid key: an optional DNS subdomain and '/', then a name of at most 63 characters "
    "(letters, digits, '-', '_', '.'; a letter or digit at each end)"
)

_VALUE = (
    "not a valid label value: at most 63 characters, letters, digits, '-', '_' and '.', a "
    "letter or digit at each end"
)

_VALUE = (
    "not a valid label value: at most 63 characters, letters, digits, '-', '_' and '.', a "
    "letter or digit at each end"
)


def _key_problem(key: str) -> str | None:
    if QUALIFIED_NAME.fullmatch(key) is None:
        return _KEY
    if "/" in key and len(key.split("/", maxsplit=1)[0]) > 253:
        return "its prefix (before '/') must be at most 253 characters"
    return None


def _not_string(value: object) -> str:
    shown = json.dumps(value)
    hint = ""
    if isinstance(value, bool):
        # e.g. `llmfleet.dev/rollout-pause: true`, which must be written "true".
        hint = " (kubectl reads on, off, yes, no, y, n, true and false unquoted as booleans)"
    return f"must be a string, not {shown}: quote it in YAML{hint}"


def problems(metadata: object) -> list[tuple[str, str]]:
    """(field, message) for each label or annotation the API server refuses."""
    if not isinstance(metadata, dict):
        return [("metadata", "must be a mapping of fields")] if metadata is not None else []
    found: list[tuple[str, str]] = []
    for field in ("labels", "annotations"):
        entries = metadata.get(field)
        if entries is None:
            continue
        if not isinstance(entries, dict):
            found.append((f"metadata.{field}", "must be a mapping of keys to strings"))
            continue
        for key, value in entries.items():
            where = f"metadata.{field}[{key}]"
            problem = _key_problem(str(key))
            if problem:
                found.append((where, problem))
            if value is None:
                continue  # null reads as "" (an empty value)
            if not isinstance(value, str):
                found.append((where, _not_string(value)))
            elif field == "labels" and LABEL_VALUE.fullmatch(value) is None:
                found.append((where, _VALUE))
        size = sum(len(str(k).encode()) + len(str(v or "").encode()) for k, v in entries.items())
        if field == "annotations" and size > ANNOTATIONS_MAX_BYTES:
            message = f"hold {size} bytes together, more than the {ANNOTATIONS_MAX_BYTES} allowed"
            found.append(("metadata.annotations", message))
    return found
