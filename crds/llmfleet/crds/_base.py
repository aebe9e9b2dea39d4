"""The base of every API model: camelCase on the wire, docstrings as descriptions, and
cross-field rules written once for both the API server (CEL) and Python (pydantic).

A `Rule` holds a CEL expression, the message a person reads when it fails, the field it points
at, and the same check in Python. The CRD renderer emits the CEL as
`x-kubernetes-validations`; `ApiModel`'s validator runs the Python check, so the operator and
the tests reject exactly what `kubectl apply` rejects, with the same words. A failed check is a
pydantic error of type `rule` whose context carries the rule's `field_path`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

RULE_ERROR = "rule"
"""The pydantic error type of a failed `Rule`; its context holds `field_path`."""
SKIP_RULES = "skip_rules"
"""Validation context key: `{SKIP_RULES: True}` parses a spec without its cross-field rules (the
shape and bounds still hold), as a spec an older CRD admitted reaches its readers."""
ADMISSION = "admission"
"""Validation context key: `{ADMISSION: True}` also runs the rules that ratchet (`Rule.ratchets`),
as the API server does for a new object; `llmfleet validate` parses so."""


@dataclass(frozen=True)
class Rule:
    """One cross-field rule of a model, in CEL and in Python."""

    cel: str
    message: str
    check: Callable[[Any], bool]
    """Python twin of `cel`: receives the model instance, returns False when the rule fails."""
    field_path: str | None = None
    """JSONPath (relative to the model, e.g. `.maxReplicas`) of the field to blame."""
    reason: str = "FieldValueInvalid"
    ratchets: bool = False
    """True for a rule that came after objects breaking it could be stored, about a field that
    does nothing as the spec stands (an option of a mode the spec does not choose). Admission
    refuses it on a new object and on an update that changes the rule's object; the API server
    ratchets it (CRD validation ratcheting, Kubernetes 1.30+: an update that leaves the rule's
    object as it was passes), and the readers (operator, gateway, autoscaler: no `ADMISSION`
    context) do not refuse a stored object over it, since the field is ignored anyway."""

    def validation(self) -> dict[str, str]:
        """The rule as one entry of `x-kubernetes-validations`."""
        return {
            "rule": self.cel,
            "message": self.message,
            **({"fieldPath": self.field_path} if self.field_path else {}),
            "reason": self.reason,
        }


def _rules_into_schema(schema: dict[str, Any], model: type[Any]) -> None:
    """Carry a model's rules into its JSON schema; the CRD renderer turns them into CEL."""
    rules: tuple[Rule, ...] = getattr(model, "rules", ())
    if rules:
        schema["x-llmfleet-rules"] = [rule.validation() for rule in rules]


class ApiModel(BaseModel):
    """Base of the API types. Field docstrings become the schema's descriptions."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        use_attribute_docstrings=True,
        extra="forbid",
        frozen=True,
        json_schema_extra=_rules_into_schema,
    )

    rules: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _check_rules(self, info: ValidationInfo) -> Self:
        context = info.context if isinstance(info.context, dict) else {}
        if context.get(SKIP_RULES):
            return self
        for rule in type(self).rules:
            if rule.ratchets and not context.get(ADMISSION):
                continue
            if not rule.check(self):
                raise PydanticCustomError(RULE_ERROR, rule.message, {"field_path": rule.field_path})
        return self

    def to_wire(self) -> dict[str, Any]:
        """The model as it appears in a manifest: camelCase, without unset optional fields."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def cel_string(text: str) -> str:
    """`text` as a CEL string literal (single quotes; tabs and newlines escaped)."""
    escaped = text.replace("\\", "\\\\").replace("'", "\\'")
    for char, code in (("\t", "\\t"), ("\n", "\\n"), ("\r", "\\r")):
        escaped = escaped.replace(char, code)
    return f"'{escaped}'"


def defaulted(model: type[ApiModel]) -> Any:
    """A field that defaults to `model()`, with that default written out in the CRD too.

    The API server checks a schema default against the CEL rules of its object *without*
    applying the nested defaults first, so the default must be the complete object.
    """
    return Field(default_factory=model, json_schema_extra={"default": model().to_wire()})
