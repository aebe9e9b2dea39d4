"""What a pass writes: a child only when the stored object does not hold its manifest, the
status only when the merge patch changes it (`drift.py`; issue 28, idle means silent)."""

from __future__ import annotations

from typing import Any

import pytest

from llmfleet.operator.drift import (
    APPLIED,
    drifted,
    first_difference,
    kept_immutable,
    patch_change,
    stamped,
)

MANIFEST: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {"name": "m-unified", "namespace": "team", "labels": {"a": "1"}},
    "spec": {"ports": [{"name": "http", "port": 8000}], "selector": {"a": "1"}},
}


def stored(**changes: Any) -> dict[str, Any]:
    """MANIFEST as the API server lists it: stamped, defaulted, without apiVersion and kind."""
    body = stamped(MANIFEST)
    body = {key: value for key, value in body.items() if key not in ("apiVersion", "kind")}
    body["metadata"] = {**body["metadata"], "uid": "u1", "resourceVersion": "7"}
    body["spec"] = {
        "ports": [{"name": "http", "port": 8000, "protocol": "TCP", "targetPort": 8000}],
        "selector": {"a": "1"},
        "type": "ClusterIP",
    }
    body["status"] = {"loadBalancer": {}}
    for path, value in changes.items():
        *parents, last = path.split("__")
        target = body
        for parent in parents:
            target = target[parent]
        target[last] = value
    return body


@pytest.mark.parametrize(
    ("body", "why"),
    [
        pytest.param(stored(), None, id="as-applied-with-defaults-is-no-write"),
        pytest.param(None, "absent", id="absent-is-applied"),
        pytest.param(stored(metadata__annotations={}), "another manifest was applied",
                     id="stamp-removed-is-applied"),
        pytest.param(stored(metadata__annotations={APPLIED: "old"}),
                     "another manifest was applied", id="older-manifest-is-applied"),
        pytest.param(stored(spec__selector={"a": "2"}), ".spec.selector.a differs",
                     id="hand-edit-is-reverted"),
        pytest.param(stored(metadata__labels={"a": "1", "b": "2"}), None,
                     id="others-labels-are-not-ours"),
        pytest.param(stored(spec__ports=[]), ".spec.ports differs", id="list-shorter"),
    ],
)  # fmt: skip
def test_drifted(body: dict[str, Any] | None, why: str | None) -> None:
    assert drifted(MANIFEST, body) == why


@pytest.mark.parametrize(
    ("wanted", "found", "path"),
    [
        pytest.param({"gpu": 1}, {"gpu": "1"}, None, id="number-matches-its-quantity-text"),
        pytest.param({"on": True}, {"on": "true"}, ".on", id="bool-is-not-text"),
        pytest.param({"x": None}, {}, None, id="unset-and-absent"),
        pytest.param({"x": None}, {"x": 1}, ".x", id="unset-but-present"),
        pytest.param({"x": [{"a": 1}]}, {"x": [{"a": 1, "b": 2}]}, None, id="defaults-in-items"),
        pytest.param({"x": [1, 2]}, {"x": [2, 1]}, ".x[0]", id="order-counts"),
        pytest.param({"x": {"y": 1}}, {"x": 3}, ".x", id="mapping-replaced"),
        pytest.param({"x": {}, "y": []}, {}, None, id="empty-map-and-list-stored-as-absent"),
        pytest.param({"x": {"y": 1}}, {}, ".x", id="a-set-map-must-be-there"),
    ],
)  # fmt: skip
def test_first_difference(wanted: Any, found: Any, path: str | None) -> None:
    assert first_difference(wanted, found) == path


@pytest.mark.parametrize(
    ("status", "patch", "change"),
    [
        pytest.param({"a": 1, "b": {"c": 2}}, {"a": 1, "b": {"c": 2}}, None, id="same"),
        pytest.param({"a": 1, "auto": {"x": 1}}, {"a": 1}, None, id="keys-not-sent-are-kept"),
        pytest.param({"a": 1}, {"a": 2}, ".a", id="value-differs"),
        pytest.param({}, {"a": None}, None, id="removing-the-absent"),
        pytest.param({"a": 1}, {"a": None}, ".a", id="removing-the-present"),
        pytest.param({"b": {"c": 2}}, {"b": {"c": None}}, ".b.c", id="nested-removal"),
        pytest.param({}, {"b": {}}, ".b", id="new-mapping"),
        pytest.param({"l": [{"t": "Ready"}]}, {"l": [{"t": "Ready"}]}, None, id="same-list"),
        pytest.param({"l": [{"t": "Ready", "x": 1}]}, {"l": [{"t": "Ready"}]}, ".l",
                     id="a-list-is-replaced-whole"),
    ],
)  # fmt: skip
def test_patch_change(status: dict[str, Any], patch: dict[str, Any], change: str | None) -> None:
    assert patch_change(status, patch) == change


def test_the_stamp_is_the_digest_of_the_manifest_as_planned() -> None:
    once = stamped(MANIFEST)
    assert stamped({**MANIFEST, "metadata": dict(MANIFEST["metadata"])}) == once
    assert (
        once["metadata"]["annotations"][APPLIED]
        != stamped({**MANIFEST, "spec": {"selector": {"a": "2"}}})["metadata"]["annotations"][
            APPLIED
        ]
    )
    assert "annotations" not in MANIFEST["metadata"]  # the plan's manifest is left as it was


HEADLESS_SERVICE: dict[str, Any] = {**MANIFEST, "spec": {**MANIFEST["spec"], "clusterIP": "None"}}


@pytest.mark.parametrize(
    ("manifest", "stored_ip", "kept"),
    [
        pytest.param(HEADLESS_SERVICE, None, "None", id="new-service-is-headless"),
        pytest.param(HEADLESS_SERVICE, "None", "None", id="headless-stays-headless"),
        pytest.param(HEADLESS_SERVICE, "10.96.0.7", None,
                     id="an-older-service-keeps-its-address"),
        pytest.param(MANIFEST, "10.96.0.7", None, id="a-service-with-an-address-wanted"),
    ],
)  # fmt: skip
def test_kept_immutable(manifest: dict[str, Any], stored_ip: str | None, kept: str | None) -> None:
    body = None if stored_ip is None else stored(spec__clusterIP=stored_ip)
    assert kept_immutable(manifest, body)["spec"].get("clusterIP") == kept
