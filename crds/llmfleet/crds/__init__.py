"""The InferenceService API (llmfleet.dev/v1alpha1): pydantic v2 models and the CRD renderer.

The models are the single source of truth: `render.crd()` turns them into the CRD (structural
schema, defaults, CEL rules, printer columns), committed under `crds/manifests/`. This package
imports no other llmfleet package.
"""

from llmfleet.crds.inference_service import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    Condition,
    InferenceService,
    InferenceServiceSpec,
    InferenceServiceStatus,
    PoolStatus,
)
from llmfleet.crds.spec import Mode, PoolSpec

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "PLURAL",
    "VERSION",
    "Condition",
    "InferenceService",
    "InferenceServiceSpec",
    "InferenceServiceStatus",
    "Mode",
    "PoolSpec",
    "PoolStatus",
]
