"""What admission checks in an InferenceService's annotations: a ValidatingAdmissionPolicy and
its binding, rendered from the rules below, each with its Python twin (pure).

The CRD's own rules cannot see `metadata` beyond the name (the API server allows no other field
there), and the rollout annotations are the one place llmfleet reads metadata: a value it does
not understand would act silently. A ValidatingAdmissionPolicy is the API server's own CEL, run
in-process like the CRD's rules: no webhook to serve, no certificates, nothing that blocks
writes while the operator is down. `render.write` commits it beside the CRD (`crds/manifests/`),
so the chart (its CRD templates), the local system and the tests install it with the CRD;
`llmfleet validate` runs the twins (`metadata.problems`).

Each rule ratchets: an annotation that an older release let in, and that an update leaves as it
was, is not refused (the operator's and kopf's own patches of the object must go on); a new or
changed one is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from llmfleet.crds import labels as L
from llmfleet.crds._base import cel_string
from llmfleet.crds.inference_service import GROUP, PLURAL

POLICY_NAME = f"{PLURAL}.{GROUP}-annotations"
"""The ValidatingAdmissionPolicy's name (its binding's too)."""
ROLLOUT_PREFIX = "llmfleet.dev/rollout-"
ROLLOUT_ANNOTATIONS = (L.ROLLOUT_PAUSE, L.ROLLOUT_PROMOTE, L.ROLLOUT_ABORT, L.ROLLOUT_RETRY)
PAUSE_VALUES = ("true", "false")
"""`rollout-pause`'s values: `"true"` holds the canary at its step, `"false"` resumes it."""


@dataclass(frozen=True)
class AnnotationRule:
    """One check of the annotations: CEL over the admission request, its message (which names
    the field: a policy's denial carries no field path), and its Python twin."""

    cel: str
    """Over `object` and `oldObject` (null on create)."""
    message: str
    field: str
    """The field the message names, as `llmfleet validate` prints it."""
    check: Callable[[Mapping[str, str]], bool]
    """Python twin: the annotations of a new object -> False when the rule refuses them."""


_NEW = "object.metadata.annotations"
_OLD = "oldObject.metadata.annotations"


def _unchanged(key: str) -> str:
    """CEL: the update leaves annotation `key` (a CEL string) as it was."""
    return (
        f"(oldObject != null && has(oldObject.metadata.annotations) && {key} in {_OLD} && "
        f"{_OLD}[{key}] == {_NEW}[{key}])"
    )


_PAUSE = cel_string(L.ROLLOUT_PAUSE)
_KNOWN = "[" + ", ".join(cel_string(key) for key in ROLLOUT_ANNOTATIONS) + "]"

RULES = (
    AnnotationRule(
        cel=f"!has({_NEW}) || !({_PAUSE} in {_NEW}) || "
        f"{_NEW}[{_PAUSE}] in [{', '.join(cel_string(v) for v in PAUSE_VALUES)}] || "
        + _unchanged(_PAUSE),
        message=f'metadata.annotations[{L.ROLLOUT_PAUSE}] must be "true" (hold the canary at '
        'its step) or "false" (resume it; or remove the annotation): another value (True, '
        "yes, 1) would be read as one of them without saying so",
        field=f"metadata.annotations[{L.ROLLOUT_PAUSE}]",
        check=lambda annotations: annotations.get(L.ROLLOUT_PAUSE, "true") in PAUSE_VALUES,
    ),
    AnnotationRule(
        cel=f"!has({_NEW}) || {_NEW}.all(k, !k.startsWith({cel_string(ROLLOUT_PREFIX)}) || "
        f"k in {_KNOWN} || {_unchanged('k')})",
        message=f"metadata.annotations: the {ROLLOUT_PREFIX}* annotations are "
        + ", ".join(key.removeprefix("llmfleet.dev/") for key in ROLLOUT_ANNOTATIONS)
        + ": another one acts on nothing (a misspelling?)",
        field="metadata.annotations",
        check=lambda annotations: all(
            not key.startswith(ROLLOUT_PREFIX) or key in ROLLOUT_ANNOTATIONS for key in annotations
        ),
    ),
)


def problems(annotations: Mapping[str, object]) -> list[tuple[str, str]]:
    """(field, message) for each rule a new object with these annotations breaks (values that
    are not strings are the API server's to refuse before, and are skipped here)."""
    strings = {str(k): v for k, v in annotations.items() if isinstance(v, str)}
    return [(rule.field, rule.message) for rule in RULES if not rule.check(strings)]


def policy() -> dict[str, Any]:
    """The ValidatingAdmissionPolicy: every rule on each create and update of the resource
    (the status subresource, which only llmfleet writes, is not matched)."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": POLICY_NAME, "labels": {"app.kubernetes.io/part-of": "llmfleet"}},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [GROUP],
                        "apiVersions": ["*"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": [PLURAL],
                    }
                ]
            },
            "validations": [
                {"expression": rule.cel, "message": rule.message, "reason": "Invalid"}
                for rule in RULES
            ],
        },
    }


def binding() -> dict[str, Any]:
    """The binding that puts the policy in force in every namespace, refusing (`Deny`)."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": POLICY_NAME, "labels": {"app.kubernetes.io/part-of": "llmfleet"}},
        "spec": {"policyName": POLICY_NAME, "validationActions": ["Deny"]},
    }
