"""The `settings:` maps of values.schema.json, derived from the components' settings classes.

Each component's `settings` accepts exactly the fields of its settings class, in camelCase,
with the field's JSON type, bounds and docstring, so a typo or a wrong type is refused by
`helm install` before anything runs. `tests/chart/test_chart_settings.py` checks the committed
schema against this; after adding or changing a settings field, rewrite it with

    .venv/bin/python -m tests.chart.settings_schema
"""

from __future__ import annotations

import ast
import inspect
import json
import textwrap
from pathlib import Path
from typing import Any

from pydantic_settings import BaseSettings

from llmfleet.autoscaler.settings import AutoscalerSettings
from llmfleet.gateway.settings import GatewaySettings
from llmfleet.operator.settings import OperatorSettings

CHART = Path(__file__).resolve().parents[2] / "charts" / "llmfleet"
SCHEMA_FILE = CHART / "values.schema.json"
COMPONENTS: dict[str, type[BaseSettings]] = {
    "operator": OperatorSettings,
    "autoscaler": AutoscalerSettings,
    "gateway": GatewaySettings,
}
"""Values key -> the settings class its `settings:` map and typed values feed."""


def camel(field: str) -> str:
    """`drain_seconds` -> `drainSeconds` (the chart turns it back with sprig's `snakecase`)."""
    first, *rest = field.split("_")
    return first + "".join(word.capitalize() for word in rest)


def env_name(settings: type[BaseSettings], field: str) -> str:
    """The environment variable a field is read from: its alias, else prefix + NAME."""
    alias = settings.model_fields[field].validation_alias
    if isinstance(alias, str):
        return alias
    return f"{settings.model_config.get('env_prefix', '')}{field.upper()}"


def docstrings(settings: type[BaseSettings]) -> dict[str, str]:
    """Each field's docstring (the string right after its annotated assignment), up the MRO."""
    found: dict[str, str] = {}
    for cls in reversed(settings.__mro__):
        if not (isinstance(cls, type) and issubclass(cls, BaseSettings)) or cls is BaseSettings:
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
        assert isinstance(body, ast.ClassDef)
        for statement, after in zip(body.body, body.body[1:], strict=False):
            if (
                isinstance(statement, ast.AnnAssign)
                and isinstance(statement.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                found[statement.target.id] = " ".join(after.value.value.split())
    return found


def _clean(node: Any, definitions: dict[str, Any]) -> Any:
    """pydantic's JSON schema made plain: refs inlined, titles and `format: path` dropped,
    `anyOf [T, null]` written as `type: [T, null]`."""
    if isinstance(node, list):
        return [_clean(item, definitions) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        return _clean(definitions[node["$ref"].rsplit("/", 1)[-1]], definitions)
    cleaned = {
        key: _clean(value, definitions)
        for key, value in node.items()
        if key != "title" and not (key == "format" and value == "path")
    }
    options = cleaned.get("anyOf")
    if (
        isinstance(options, list)
        and len(options) == 2
        and {"type": "null"} in options
        and all(set(option) == {"type"} for option in options)
    ):
        del cleaned["anyOf"]
        cleaned["type"] = [option["type"] for option in options if option != {"type": "null"}]
        cleaned["type"].append("null")
    return cleaned


def settings_schema(settings: type[BaseSettings]) -> dict[str, Any]:
    """The schema of one component's `settings:` map."""
    schema = settings.model_json_schema(by_alias=False)
    definitions = schema.get("$defs", {})
    described = docstrings(settings)
    properties: dict[str, Any] = {}
    for field, node in schema["properties"].items():
        prop = _clean(node, definitions)
        prop["description"] = f"{env_name(settings, field)}. {described.get(field, '')}".strip()
        properties[camel(field)] = prop
    return {
        "type": "object",
        "description": f"Any field of {settings.__name__} (camelCase); null: its default.",
        "additionalProperties": False,
        "properties": properties,
    }


def expected_schema(current: dict[str, Any]) -> dict[str, Any]:
    """`current` (the committed schema) with each component's `settings` derived anew."""
    schema: dict[str, Any] = json.loads(json.dumps(current))
    for component, settings in COMPONENTS.items():
        schema["properties"][component]["properties"]["settings"] = settings_schema(settings)
    return schema


def main() -> None:
    current = json.loads(SCHEMA_FILE.read_text())
    SCHEMA_FILE.write_text(json.dumps(expected_schema(current), indent=2) + "\n")
    print(f"wrote {SCHEMA_FILE}")


if __name__ == "__main__":
    main()
