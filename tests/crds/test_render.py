"""The rendered CRD: committed and fresh, structural, described, with rules and columns."""

from __future__ import annotations

from typing import Any

from llmfleet.crds import labels, render


def walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        found.append((path, node))
        for name, child in node.get("properties", {}).items():
            found += walk(child, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            found += walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            found += walk(node["additionalProperties"], f"{path}{{}}")
    return found


def schema() -> dict[str, Any]:
    version = render.crd()["spec"]["versions"][0]
    root: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return root


def test_committed_crd_is_what_the_models_render() -> None:
    assert render.stale_files() == [], "run `llmfleet crds render` and commit the result"


def test_schema_is_structural() -> None:
    for path, node in walk(schema()):
        assert "type" in node, f"{path or 'root'} has no type"
        for key in ("$ref", "anyOf", "oneOf", "allOf", "title", "$defs", "const"):
            assert key not in node, f"{path}: {key} is not allowed in a structural schema"
        if "exclusiveMinimum" in node:
            assert node["exclusiveMinimum"] is True
        assert not ("properties" in node and "additionalProperties" in node), path


def test_every_spec_and_status_field_is_described() -> None:
    undescribed = [
        path for path, node in walk(schema())
        if path.startswith((".spec.", ".status.")) and not path.endswith(("[]", "{}"))
        and not node.get("description")
    ]  # fmt: skip
    assert undescribed == []


def test_cross_field_rules_are_cel_validations() -> None:
    nodes = dict(walk(schema()))
    rules = {
        path: [rule["rule"] for rule in node.get("x-kubernetes-validations", [])]
        for path, node in nodes.items()
    }
    assert any("Disaggregated" in rule for rule in rules[".spec.topology"])
    assert any("tensorParallel" in rule for rule in rules[".spec.runtime"])
    assert any("maxReplicas" in rule for rule in rules[".spec.topology.unified"])
    assert any("isSorted" in rule for rule in rules[".spec.rollout"])
    assert any("Exists" in rule for rule in rules[".spec.topology.unified.tolerations[]"])
    # replicas, minimum footprint, one pod
    assert sum("gpuBudget" in rule for rule in rules[".spec"]) == 3
    assert any("maxBatchedTokens" in rule for rule in rules[".spec"])
    assert sum("nvidia.com/gpu.product" in rule for rule in rules[".spec"]) == 3


def test_the_name_is_checked_at_the_root() -> None:
    """CEL reads `metadata.name` only from the root; a fieldPath there must name a declared
    property, and metadata may declare only name (and generateName)."""
    root = schema()
    assert root["properties"]["metadata"] == {
        "type": "object",
        "properties": {"name": {"type": "string"}},
    }
    checks = root["x-kubernetes-validations"]
    assert [check["fieldPath"] for check in checks] == [
        ".metadata.name",
        ".metadata.name",
        ".spec.traffic.cascade.tiers",
        ".spec.traffic.degradation.service",
    ]
    assert any(f"size() <= {labels.SERVICE_NAME_MAX_LENGTH}" in c["rule"] for c in checks)


def test_env_is_a_map_keyed_by_name() -> None:
    env = dict(walk(schema()))[".spec.runtime.env"]
    assert env["x-kubernetes-list-type"] == "map"
    assert env["x-kubernetes-list-map-keys"] == ["name"]
    assert "name" in env["items"]["required"]


def test_no_bound_is_past_what_a_float64_holds_exactly() -> None:
    """The API server checks bounds as float64 and refuses a bound that is no integer there."""
    for path, node in walk(schema()):
        for bound in ("minimum", "maximum"):
            if node.get("type") == "integer" and bound in node:
                assert abs(node[bound]) <= 2**53 - 1, path


def test_defaults_and_enums_reach_the_schema() -> None:
    nodes = dict(walk(schema()))
    assert nodes[".spec.topology.mode"]["default"] == "Unified"
    assert nodes[".spec.topology.mode"]["enum"] == ["Unified", "Disaggregated"]
    assert nodes[".spec.runtime.gpu"]["default"] == {"type": "H100", "count": 1}
    assert nodes[".spec.topology"]["default"] == {"mode": "Unified"}
    assert nodes[".spec.runtime.gpu.count"]["default"] == 1
    # Unset, replicas follows minReplicas (PoolSpec): a schema default would hide that.
    assert "default" not in nodes[".spec.topology.unified.replicas"]
    assert nodes[".spec.slo.ttftP95Ms"]["minimum"] == 0
    assert nodes[".spec.slo.ttftP95Ms"]["exclusiveMinimum"] is True


def test_printer_columns_and_status_subresource() -> None:
    version = render.crd()["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = [column["name"] for column in version["additionalPrinterColumns"]]
    assert columns[:6] == ["Mode", "Ready", "Serving", "Canary", "Endpoint", "Age"]
    assert render.crd()["spec"]["names"]["shortNames"] == ["llmsvc"]
