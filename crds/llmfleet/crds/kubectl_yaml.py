"""YAML read as kubectl reads it (pure).

kubectl (`apply`, `create`, and Argo CD and Flux alike) decodes a manifest with sigs.k8s.io/yaml:
go-yaml v2 resolves each plain scalar, then the document goes to the API server as JSON. go-yaml
v2's rules are neither YAML 1.1 (PyYAML's) nor YAML 1.2 core:
- booleans: `y Y yes Yes YES on On ON true True TRUE` and `n N no No NO off Off OFF false False
  FALSE` (so `on` is true, as in YAML 1.1, unlike YAML 1.2);
- null: empty, `~ null Null NULL`;
- integers as Go's `strconv.ParseInt(text without "_", 0, 64)`: `1_000`, `0x1F`, `0o17`, `0b11`
  and `0755` (octal, 493); past int64, an unsigned integer, then a float;
- floats: `[-+]?(\\.[0-9]+|[0-9]+(\\.[0-9]*)?)([eE][-+]?[0-9]+)?`, so `4e3` and `1.` are numbers
  (PyYAML reads `4e3` as a string) and `.inf` / `.nan` are floats (JSON cannot carry them:
  kubectl refuses the file);
- no sexagesimal numbers: `3:00` is a string (PyYAML reads 180); dates and times stay strings.
Checked against kubectl v1.32's client-side decoding; the tests hold a table of these cases.

`dump` writes YAML that kubectl reads back as the same document: a string whose plain spelling
go-yaml v2 would read as something else (`08192`, `on`, `4e3`, `0x1F`) is quoted. PyYAML's own
dumper quotes only what YAML 1.1 reads as another type, so it writes `08192` and `4e3` plain.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator

import yaml

_BOOLEANS_AND_NULLS: dict[str, object] = {
    **dict.fromkeys(("y", "Y", "yes", "Yes", "YES", "on", "On", "ON"), True),
    **dict.fromkeys(("true", "True", "TRUE"), True),
    **dict.fromkeys(("n", "N", "no", "No", "NO", "off", "Off", "OFF"), False),
    **dict.fromkeys(("false", "False", "FALSE"), False),
    **dict.fromkeys(("", "~", "null", "Null", "NULL"), None),
    **dict.fromkeys((".nan", ".NaN", ".NAN"), math.nan),
    **dict.fromkeys((".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"), math.inf),
    **dict.fromkeys(("-.inf", "-.Inf", "-.INF"), -math.inf),
}
_GO_INTEGER = re.compile(r"([+-]?)(0[xX][0-9a-fA-F]+|0[oO][0-7]+|0[bB][01]+|0[0-7]*|[1-9][0-9]*)")
_GO_UNSIGNED = re.compile(r"(0[xX][0-9a-fA-F]+|0[oO][0-7]+|0[bB][01]+|0[0-7]*|[1-9][0-9]*)")
_YAML_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_BASES = {"x": 16, "o": 8, "b": 2}


def _go_integer(text: str, pattern: re.Pattern[str]) -> int | None:
    match = pattern.fullmatch(text)
    if match is None:
        return None
    sign, body = (match[1], match[2]) if pattern is _GO_INTEGER else ("", match[1])
    if len(body) > 1 and body[1].lower() in _BASES:
        value = int(body[2:], _BASES[body[1].lower()])
    else:
        value = int(body, 8 if body.startswith("0") and len(body) > 1 else 10)
    return -value if sign == "-" else value


def scalar(text: str) -> object:
    """A plain (unquoted) scalar as go-yaml v2 resolves it."""
    if text in _BOOLEANS_AND_NULLS:
        return _BOOLEANS_AND_NULLS[text]
    if text[0] == ".":
        return _float(text)
    if text[0] not in "+-0123456789":
        return text
    plain = text.replace("_", "")
    signed = _go_integer(plain, _GO_INTEGER)
    if signed is not None and -(2**63) <= signed < 2**63:
        return signed
    unsigned = _go_integer(plain, _GO_UNSIGNED)
    if unsigned is not None and unsigned < 2**64:
        return unsigned
    return _float(plain) if _YAML_FLOAT.fullmatch(plain) else text


def _float(text: str) -> object:
    try:
        value = float(text)
    except ValueError:
        return text
    # Go's ParseFloat refuses what overflows (`1e400`): the text stays a string.
    return value if math.isfinite(value) else text


_PLAIN = "tag:llmfleet.dev,2026:plain"


class KubectlLoader(yaml.SafeLoader):
    """PyYAML's safe loader with go-yaml v2's resolution of plain scalars."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[object, object]:
        """Keys as JSON text while the mapping is built (`on` and `1` must not collide as
        Python's True and 1 would)."""
        if isinstance(node, yaml.MappingNode):
            self.flatten_mapping(node)
        return {
            _key(self.construct_object(key, deep=deep)): self.construct_object(value, deep=deep)
            for key, value in node.value
        }


KubectlLoader.yaml_implicit_resolvers = {}
KubectlLoader.add_implicit_resolver("tag:yaml.org,2002:merge", re.compile(r"^(?:<<)$"), ["<"])
KubectlLoader.add_implicit_resolver(_PLAIN, re.compile(r"(?s).*"), None)
KubectlLoader.add_constructor(
    _PLAIN,
    lambda loader, node: scalar(loader.construct_scalar(node)),  # type: ignore[arg-type]
)


def _key(key: object) -> object:
    """A mapping key as JSON carries it (sigs.k8s.io/yaml writes non-string keys as text)."""
    if isinstance(key, bool):
        return "true" if key else "false"
    if key is None:
        return "null"
    if isinstance(key, int | float):
        return str(key) if isinstance(key, int) or not key.is_integer() else str(int(key))
    return key


def documents(text: str) -> Iterator[tuple[int, object]]:
    """The documents of a YAML stream as kubectl sends them, numbered from 1 (an empty one is
    None). A YAML error is raised (`yaml.YAMLError`) when the reading reaches it, after the
    documents before it."""
    yield from enumerate(yaml.load_all(text, Loader=KubectlLoader), 1)


class KubectlDumper(yaml.SafeDumper):
    """PyYAML's safe dumper that quotes every string go-yaml v2 would read as something else
    (a number, a boolean, null); numbers and booleans are written as PyYAML writes them."""


def _represent_str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    read = scalar(text) if text else None
    style = None if read == text and isinstance(read, str) else "'"
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


KubectlDumper.add_representer(str, _represent_str)


def dump(document: object) -> str:
    """One document as YAML that kubectl sends as `document` itself."""
    return yaml.dump(document, Dumper=KubectlDumper, sort_keys=False)


def dump_all(documents: Iterable[object]) -> str:
    """Several documents, `---` between them (see `dump`)."""
    return yaml.dump_all(documents, Dumper=KubectlDumper, sort_keys=False, explicit_start=True)
