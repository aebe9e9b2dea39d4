"""Network isolation, pure: each service's NetworkPolicy (who may reach its engine pods, on which
port) and `status.endpoint` (the gateway's URL, never a pool Service)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from llmfleet.crds import Condition
from llmfleet.crds import labels as L
from llmfleet.operator.observed import Observed, ObservedChild, ObservedPod
from llmfleet.operator.plan import Plan, desired
from llmfleet.operator.settings import OperatorSettings
from tests.operator.test_plan import load

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
SETTINGS = OperatorSettings(drain_seconds=90)
ENGINE_PORT = [{"protocol": "TCP", "port": L.ENGINE_PORT}]

GATEWAY = {
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "llmfleet",
                                    "app.kubernetes.io/component": "gateway"}},
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "llmfleet"}},
}  # fmt: skip
PROMETHEUS = {
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
}
OPERATOR = {
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "llmfleet",
                                    "app.kubernetes.io/component": "operator"}},
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "llmfleet"}},
}  # fmt: skip
"""The operator asks draining engines for their in-flight count on the engine port."""
BASE = [(GATEWAY, ENGINE_PORT), (PROMETHEUS, ENGINE_PORT), (OPERATOR, ENGINE_PORT)]


def siblings(service: str) -> dict[str, Any]:
    return {
        "podSelector": {
            "matchLabels": {L.SERVICE: service},
            "matchExpressions": [
                {"key": L.POOL, "operator": "In", "values": ["prefill", "decode"]}
            ],
        }
    }


def policy(plan: Plan) -> dict[str, Any]:
    [found] = [o for o in plan.objects if o["kind"] == "NetworkPolicy"]
    return found


def rules(plan: Plan) -> list[tuple[dict[str, Any], list[dict[str, Any]] | None]]:
    """Each ingress peer with the ports it may reach (None: every port)."""
    return [
        (peer, rule.get("ports"))
        for rule in policy(plan)["spec"]["ingress"]
        for peer in rule["from"]
    ]


def old_pods(*pools: str) -> Observed:
    """Pods of pools the spec no longer has, still serving while the new ones start."""
    return Observed(
        pods=tuple(
            ObservedPod(name=f"old-{pool}", pool=pool, created=NOW - timedelta(minutes=5),
                        ready=True, serving=True)
            for pool in pools
        )
    )  # fmt: skip


@pytest.mark.parametrize(
    ("sample", "observed", "expected"),
    [
        pytest.param("unified", Observed(), BASE,
                     id="unified-gateway-prometheus-and-operator-only"),
        pytest.param("disaggregated", Observed(), [*BASE, (siblings("llama-70b-pd"), None)],
                     id="disaggregated-also-prefill-and-decode-each-other-every-port"),
        pytest.param("unified", old_pods("prefill", "decode"),
                     [*BASE, (siblings("llama-8b"), None)],
                     id="back-to-unified-while-old-prefill-and-decode-pods-serve"),
        pytest.param("unified", old_pods("unified"), BASE,
                     id="unified-pods-need-no-kv-transfer"),
    ],
)  # fmt: skip
def test_the_policy_admits_exactly_these_sources(
    sample: str, observed: Observed, expected: list[tuple[dict[str, Any], Any]]
) -> None:
    assert rules(desired(load(sample), observed, SETTINGS, NOW)) == expected


def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector (matchLabels, matchExpressions with In) against a pod's labels."""
    if any(labels.get(key) != value for key, value in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "In", expression
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


def pod_labels(plan: Plan) -> dict[str, dict[str, str]]:
    """Pool -> the labels of its pods (the Deployment's template; the serving flag varies)."""
    return {
        o["metadata"]["labels"][L.POOL]: o["spec"]["template"]["metadata"]["labels"]
        for o in plan.objects
        if o["kind"] == "Deployment"
    }


@pytest.mark.parametrize("serving", ["true", "false"], ids=["serving", "spare-or-draining"])
@pytest.mark.parametrize("sample", ["unified", "disaggregated"])
def test_the_policy_selects_every_engine_pod_of_its_service_only(sample: str, serving: str) -> None:
    plan = desired(load(sample), Observed(), SETTINGS, NOW)
    selector = policy(plan)["spec"]["podSelector"]
    for labels in pod_labels(plan).values():
        assert matches(selector, labels | {L.SERVING: serving})
        assert not matches(selector, labels | {L.SERVICE: "another-service"})
    assert policy(plan)["spec"]["policyTypes"] == ["Ingress"], "egress (model downloads) open"


def test_kv_transfer_peers_are_the_services_own_prefill_and_decode_pods() -> None:
    plan = desired(load("disaggregated"), Observed(), SETTINGS, NOW)
    [(peer, _)] = [(p, ports) for p, ports in rules(plan) if ports is None]
    assert "namespaceSelector" not in peer, "the policy's own namespace only"
    pools = pod_labels(plan)
    assert sorted(pools) == ["decode", "prefill"]
    for labels in pools.values():
        assert matches(peer["podSelector"], labels)
        assert not matches(peer["podSelector"], labels | {L.SERVICE: "another-service"})
    assert not matches(peer["podSelector"], pools["decode"] | {L.POOL: "unified"})


def test_without_the_in_flight_probe_the_operator_is_not_admitted() -> None:
    settings = OperatorSettings(probe_in_flight=False)
    peers = [peer for peer, _ in rules(desired(load("unified"), Observed(), settings, NOW))]
    assert peers == [GATEWAY, PROMETHEUS]


def test_the_selectors_are_operator_settings() -> None:
    settings = OperatorSettings(
        gateway_namespace="edge", gateway_pod_labels={"app": "gw"},
        prometheus_namespace="", prometheus_pod_labels={"app": "prom", "shard": "0"},
        operator_namespace="ops", operator_pod_labels={"app": "op"},
    )  # fmt: skip
    peers = [peer for peer, _ in rules(desired(load("unified"), Observed(), settings, NOW))]
    assert peers == [
        {"podSelector": {"matchLabels": {"app": "gw"}},
         "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "edge"}}},
        # An empty namespace setting: any namespace (an empty namespaceSelector), not none.
        {"podSelector": {"matchLabels": {"app": "prom", "shard": "0"}}, "namespaceSelector": {}},
        {"podSelector": {"matchLabels": {"app": "op"}},
         "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}}},
    ]  # fmt: skip


@pytest.mark.parametrize(
    "field", ["gateway_pod_labels", "prometheus_pod_labels", "operator_pod_labels"]
)
def test_an_empty_pod_selector_is_refused(field: str) -> None:
    # {} would select every pod of the namespace (or of the cluster): no isolation at all.
    with pytest.raises(ValidationError, match=field):
        OperatorSettings.model_validate({field: {}})


def test_the_policy_is_a_child_like_the_others() -> None:
    found = policy(desired(load("unified"), Observed(), SETTINGS, NOW))
    assert found["metadata"]["name"] == "llama-8b-engines"
    assert found["metadata"]["labels"] == {L.SERVICE: "llama-8b", L.MANAGED_BY: L.MANAGED_BY_VALUE}
    [owner] = found["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("InferenceService", "uid-1", True)


def _observed_policy(name: str) -> ObservedChild:
    return ObservedChild(
        api_version="networking.k8s.io/v1", kind="NetworkPolicy", namespace="team", name=name,
        uid="uid-np", labels={L.SERVICE: "llama-8b", L.MANAGED_BY: L.MANAGED_BY_VALUE},
        controller_uid="uid-1",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("network_policy", "deleted"),
    [
        pytest.param(True, [], id="wanted-kept"),
        pytest.param(False, ["NetworkPolicy llama-8b-engines"], id="switched-off-pruned"),
    ],
)
def test_pruning_removes_the_policy_once_unwanted(network_policy: bool, deleted: list[str]) -> None:
    settings = OperatorSettings(network_policy=network_policy)
    observed = Observed(children=(_observed_policy("llama-8b-engines"),))
    plan = desired(load("unified"), observed, settings, NOW)
    assert [f"{c.kind} {c.name}" for c in plan.deletions] == deleted
    assert any(o["kind"] == "NetworkPolicy" for o in plan.objects) == network_policy


def test_a_look_alike_policy_is_never_pruned() -> None:
    stranger = ObservedChild(
        api_version="networking.k8s.io/v1", kind="NetworkPolicy", namespace="team",
        name="llama-8b-engines-by-hand", uid="uid-x",
        labels={L.SERVICE: "llama-8b", L.MANAGED_BY: L.MANAGED_BY_VALUE}, controller_uid=None,
    )  # fmt: skip
    plan = desired(load("unified"), Observed(children=(stranger,)), SETTINGS, NOW)
    assert plan.deletions == ()


def _condition(plan: Plan, kind: str) -> dict[str, Any]:
    conditions: list[dict[str, Any]] = plan.status["conditions"]  # type: ignore[assignment]
    return next(c for c in conditions if c["type"] == kind)


def test_the_endpoint_is_the_gateways_url() -> None:
    settings = OperatorSettings(gateway_url="https://llm.example.com")
    plan = desired(load("disaggregated"), Observed(), settings, NOW)
    assert plan.status["endpoint"] == "https://llm.example.com"
    published = _condition(plan, "EndpointPublished")
    assert (published["status"], published["reason"]) == ("True", "GatewayURL")
    assert "https://llm.example.com" in published["message"]


@pytest.mark.parametrize("sample", ["unified", "disaggregated"])
def test_without_a_gateway_url_no_endpoint_is_published(sample: str) -> None:
    service = load(sample)
    plan = desired(service, Observed(), OperatorSettings(gateway_url=""), NOW)
    # "": the merge patch replaces an endpoint written before (a pool Service's, say) with
    # what the CRD defaults an absent one to, so an idle pass finds nothing to change.
    assert plan.status["endpoint"] == ""
    published = _condition(plan, "EndpointPublished")
    assert (published["status"], published["reason"]) == ("False", "NoGatewayURL")
    assert "LLMFLEET_OPERATOR_GATEWAY_URL" in published["message"]
    assert f"`{service.spec.served_name}`" in published["message"]
    assert ".svc" not in str(plan.status), "no pool Service address anywhere in the status"


def test_the_endpoint_condition_keeps_its_transition_time() -> None:
    first = desired(load("unified"), Observed(), SETTINGS, NOW)
    written: list[dict[str, Any]] = first.status["conditions"]  # type: ignore[assignment]
    observed = Observed(conditions=tuple(Condition.model_validate(c) for c in written))
    later = desired(load("unified"), observed, SETTINGS, NOW + timedelta(minutes=5))
    stamps = [_condition(p, "EndpointPublished")["lastTransitionTime"] for p in (first, later)]
    assert stamps == ["2026-11-22T12:00:00Z"] * 2
