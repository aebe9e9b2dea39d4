"""What a pass must write, decided by comparing with what it observed (pure: no I/O).

An idle operator is silent at the API server (issue 28): a child is applied only when the
object as stored differs from the manifest, and the status only when the merge patch would
change it. A periodic resync runs the same comparison, so it writes only what drifted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llmfleet.operator.failures import digest

APPLIED = "llmfleet.dev/applied"
"""Annotation on every child: the digest of the manifest last applied. A field the operator no
longer sets stays in the stored object until the next apply removes it (server-side apply
drops fields its manager stops sending), and only a changed digest reveals that."""


def stamped(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """`manifest` with its `APPLIED` digest (of the manifest as planned, without the stamp)."""
    metadata = dict(manifest["metadata"])
    metadata["annotations"] = {**(metadata.get("annotations") or {}), APPLIED: digest(manifest)}
    return {**manifest, "metadata": metadata}


def kept_immutable(
    manifest: Mapping[str, Any], stored: Mapping[str, Any] | None
) -> Mapping[str, Any]:
    """`manifest` without a headless `spec.clusterIP` when the stored Service already has an
    address (a pool Service created by an older operator): the API server refuses to change the
    field once set, and the Service works as it is (nothing connects to that address)."""
    spec = manifest.get("spec") or {}
    held = ((stored or {}).get("spec") or {}).get("clusterIP")
    if manifest["kind"] != "Service" or spec.get("clusterIP") != "None" or held in (None, "None"):
        return manifest
    return {**manifest, "spec": {k: v for k, v in spec.items() if k != "clusterIP"}}


def drifted(manifest: Mapping[str, Any], stored: Mapping[str, Any] | None) -> str | None:
    """Why `manifest` must be applied over `stored` (None: it need not be).

    It must when the object does not exist, carries another manifest's digest (the spec
    changed, or the stamp was removed), or differs from the manifest in a field the manifest
    sets (a hand edit, another controller). Fields only the API server or others set (defaults,
    status, other labels) are not compared.
    """
    if stored is None:
        return "absent"
    annotations = stored.get("metadata", {}).get("annotations") or {}
    if annotations.get(APPLIED) != digest(manifest):
        return "another manifest was applied"
    # A listed item has no apiVersion and kind (the list has them): the key matched both.
    fields = {key: value for key, value in manifest.items() if key not in ("apiVersion", "kind")}
    path = first_difference(fields, stored)
    return None if path is None else f"{path} differs"


def first_difference(wanted: Any, found: Any, path: str = "") -> str | None:
    """The path of the first field `wanted` sets that `found` does not hold as set; None when
    `found` holds all of `wanted`.

    Mappings compare key by key (extra keys in `found` are defaults or others' fields); a key
    set to None must be absent, and one set to an empty map or list may be (the API server
    stores neither: a pod's `nodeSelector: {}` comes back without the key). Lists compare item
    by item at the same position, with the same length (the API server keeps the order of
    containers, ports, env). A number matches its decimal text (a resource quantity such as
    `nvidia.com/gpu: 1` is stored as "1").
    """
    if isinstance(wanted, Mapping):
        return _mapping_difference(wanted, found, path)
    if isinstance(wanted, list):
        return _list_difference(wanted, found, path)
    return None if _same_scalar(wanted, found) else path or "."


def _mapping_difference(wanted: Mapping[str, Any], found: Any, path: str) -> str | None:
    if not isinstance(found, Mapping):
        return path or "."
    for key, value in wanted.items():
        inner = f"{path}.{key}"
        if value is None:
            if found.get(key) is not None:
                return inner
            continue
        if key not in found:
            if value in ({}, []):
                continue  # the API server omits an empty map or list (`omitempty`)
            return inner
        deeper = first_difference(value, found[key], inner)
        if deeper is not None:
            return deeper
    return None


def _list_difference(wanted: list[Any], found: Any, path: str) -> str | None:
    if not isinstance(found, list) or len(found) != len(wanted):
        return path or "."
    for index, (item, there) in enumerate(zip(wanted, found, strict=True)):
        deeper = first_difference(item, there, f"{path}[{index}]")
        if deeper is not None:
            return deeper
    return None


def _same_scalar(wanted: Any, found: Any) -> bool:
    if isinstance(wanted, bool) or isinstance(found, bool):
        return wanted is found
    if isinstance(wanted, int | float) and isinstance(found, str):
        return str(wanted) == found
    return bool(wanted == found)


def patch_change(stored: Mapping[str, Any], patch: Mapping[str, Any], path: str = "") -> str | None:
    """The first path where the JSON merge patch `patch` (RFC 7386) would change `stored`: a
    key set to None that exists, a mapping that changes something inside, any other value
    that differs; None when applying it would leave `stored` as it is."""
    for key, value in patch.items():
        inner = f"{path}.{key}"
        if value is None:
            if key in stored:
                return inner
        elif isinstance(value, Mapping):
            there = stored.get(key)
            if not isinstance(there, Mapping):
                return inner
            deeper = patch_change(there, value, inner)
            if deeper is not None:
                return deeper
        elif key not in stored or stored[key] != value:
            return inner
    return None
