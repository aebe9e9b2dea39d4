"""Parts of `spec` that shape the engine pod itself rather than vLLM: env entries from Secrets
and ConfigMaps, the model cache, image pull secrets, CPU/memory and /dev/shm overrides.

None of them reaches the runtime ConfigMap: the operator puts them on the pod only, so a
Secret's value is resolved by the kubelet and is never written into any object llmfleet owns.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction
from typing import Annotated

from pydantic import Field

from llmfleet.crds._base import ApiModel, Rule

DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
"""A Kubernetes object name (Secret, ConfigMap, PersistentVolumeClaim): at most 253 characters."""
ObjectName = Annotated[str, Field(pattern=DNS_SUBDOMAIN, min_length=1, max_length=253)]
QUANTITY = (
    r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)"
    r"(([KMGTPE]i)|[mkMGTPE]|([eE][+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)))?$"
)
"""A non-negative Kubernetes resource quantity (`500m`, `8`, `64Gi`, `1.5G`)."""
Quantity = Annotated[str, Field(pattern=QUANTITY, min_length=1, max_length=64)]
_SUFFIXES = {
    **{f"{prefix}i": Fraction(1024) ** power for power, prefix in enumerate("KMGTPE", 1)},
    **{prefix: Fraction(1000) ** power for power, prefix in enumerate("kMGTPE", 1)},
    "m": Fraction(1, 1000),
    "": Fraction(1),
}


def quantity(text: str) -> Fraction:
    """A quantity's value (`500m` is 1/2, `64Gi` 64 x 2^30), as CEL's `quantity()` compares
    them; `text` must match `QUANTITY`."""
    number = re.match(r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)", text)
    assert number is not None, text
    value, suffix = Fraction(number[0]), text[number.end() :]
    if suffix[:1] in ("e", "E") and len(suffix) > 1:
        return value * Fraction(10) ** int(Fraction(suffix[1:]))
    return value * _SUFFIXES[suffix]


class KeySelector(ApiModel):
    """One key of a Secret or ConfigMap in the service's namespace."""

    name: ObjectName
    """The Secret's (or ConfigMap's) name."""
    key: Annotated[str, Field(pattern=r"^[-._a-zA-Z0-9]+$", min_length=1, max_length=253)]
    """The key whose value the variable gets."""
    optional: bool | None = None
    """Start the pod even when the object or key is missing (the variable is then unset)."""


class EnvVarSource(ApiModel):
    """Where an env entry's value comes from: exactly one of a Secret's or a ConfigMap's key."""

    secret_key_ref: KeySelector | None = None
    """A key of a Secret: the kubelet reads it; llmfleet never sees the value."""
    config_map_key_ref: KeySelector | None = None
    """A key of a ConfigMap."""

    rules = (
        Rule(
            cel="has(self.secretKeyRef) != has(self.configMapKeyRef)",
            message="valueFrom takes exactly one of secretKeyRef and configMapKeyRef",
            check=lambda s: (s.secret_key_ref is None) != (s.config_map_key_ref is None),
        ),
    )


class LocalRef(ApiModel):
    name: ObjectName
    """The object's name, in the service's namespace."""


class ObjectRef(ApiModel):
    name: ObjectName
    """The object's name, in the service's namespace."""
    optional: bool | None = None
    """Start the pod even when it is missing."""


class EnvFromSource(ApiModel):
    """Every key of a Secret or ConfigMap as an env entry (`envFrom` of the engine container)."""

    secret_ref: ObjectRef | None = None
    """A Secret, every key of which becomes a variable."""
    config_map_ref: ObjectRef | None = None
    """A ConfigMap, every key of which becomes a variable."""
    prefix: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=128)] | None = None
    """Put before every key's name."""

    rules = (
        Rule(
            cel="has(self.secretRef) != has(self.configMapRef)",
            message="an envFrom entry takes exactly one of secretRef and configMapRef",
            check=lambda s: (s.secret_ref is None) != (s.config_map_ref is None),
        ),
    )


class ModelCache(ApiModel):
    """Where the engine pods keep the weights they download (`HF_HOME`). Unset: an emptyDir per
    pod, so each pod downloads once per start."""

    claim_name: ObjectName | None = None
    """A PersistentVolumeClaim in the service's namespace that every pod of the service mounts
    as its hub cache (ReadWriteMany, so the pods share one copy: the first one downloads, later
    ones load from it). Unset: an emptyDir per pod."""
    size_limit: Quantity | None = None
    """The emptyDir's size limit (the weights plus a margin; the kubelet evicts a pod past it).
    Without `claimName` only."""

    rules = (
        Rule(
            cel="!has(self.claimName) || !has(self.sizeLimit)",
            message="model.cache.sizeLimit sizes the per-pod emptyDir: remove it with claimName "
            "(the PersistentVolumeClaim has its own size)",
            field_path=".sizeLimit",
            check=lambda c: c.claim_name is None or c.size_limit is None,
        ),
    )


def _limit_holds(key: str) -> Callable[[ResourceOverrides], bool]:
    """Python twin of the rule on `limits.<key>`: at least `requests.<key>` when both are set."""

    def check(r: ResourceOverrides) -> bool:
        request = getattr(r.requests, key, None)
        limit = getattr(r.limits, key, None)
        return request is None or limit is None or quantity(limit) >= quantity(request)

    return check


class ComputeResources(ApiModel):
    """CPU and memory of the engine container (`cpu`, `memory` keys only; GPUs come from
    `runtime.gpu.count`)."""

    cpu: Quantity | None = None
    """CPU cores."""
    memory: Quantity | None = None
    """Memory, the /dev/shm volume included (it is memory the container is charged for)."""


class ResourceOverrides(ApiModel):
    """Replaces the requests and limits the operator derives from the GPU type, key by key."""

    requests: ComputeResources | None = None
    """CPU and memory requests; unset keys keep the derived value."""
    limits: ComputeResources | None = None
    """CPU and memory limits; unset keys keep the derived value (memory: the request; CPU: no
    limit). A limit given without its request lowers the derived request to it when that is
    higher (a request above its limit is refused by the API server)."""

    rules = tuple(
        Rule(
            cel=f"!has(self.requests) || !has(self.limits) || !has(self.requests.{key}) || "
            f"!has(self.limits.{key}) || "
            f"quantity(self.limits.{key}).compareTo(quantity(self.requests.{key})) >= 0",
            message=f"runtime.resources.limits.{key} is below requests.{key}: the API server "
            "refuses a container whose request exceeds its limit",
            field_path=f".limits.{key}",
            check=_limit_holds(key),
        )
        for key in ("cpu", "memory")
    )
