"""The chart's RBAC as rendered: the shape of least privilege (test_rbac_chart.py asks the API
server what each ServiceAccount may really do)."""

from __future__ import annotations

from typing import Any

import pytest

from llmfleet.operator import kube as operator_kube
from llmfleet.operator.watched import POD
from tests.chart import helm

CLUSTER_SCOPED = {"customresourcedefinitions", "namespaces", "nodes", "clusterkopfpeerings"}
"""The cluster-scoped resources the operator reads (each said why in operator/rbac.yaml)."""
MODES = [
    pytest.param({}, id="all-namespaces"),
    pytest.param({"watchNamespaces": ["models-a"]}, id="one-namespace"),
    pytest.param({"watchNamespaces": ["models-a", "models-b"]}, id="two-namespaces"),
    pytest.param({"gateway.apiKeys.existingSecret": "keys"}, id="api-keys"),
]


def rules(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return list(doc.get("rules") or [])


def roles(docs: list[dict[str, Any]], component: str, kind: str) -> list[dict[str, Any]]:
    return [
        doc
        for doc in helm.find(docs, kind)
        if doc["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]


@pytest.mark.parametrize("values", MODES)
def test_no_wildcards_and_no_secrets_but_the_api_keys(values: dict[str, Any]) -> None:
    docs = helm.template(values)
    granted = [rule for kind in ("Role", "ClusterRole") for doc in helm.find(docs, kind)
               for rule in rules(doc)]  # fmt: skip
    assert granted
    for rule in granted:
        assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], rule
    secrets = [rule for rule in granted if "secrets" in rule["resources"]]
    if "gateway.apiKeys.existingSecret" in values:
        assert secrets == [
            {
                "apiGroups": [""],
                "resources": ["secrets"],
                "resourceNames": ["keys"],
                "verbs": ["get"],
            }
        ]
    else:
        assert secrets == []


@pytest.mark.parametrize("values", MODES)
def test_each_binding_grants_its_own_components_account_only(values: dict[str, Any]) -> None:
    docs = helm.template(values)
    bindings = helm.find(docs, "RoleBinding") + helm.find(docs, "ClusterRoleBinding")
    assert bindings
    for binding in bindings:
        component = binding["metadata"]["labels"]["app.kubernetes.io/component"]
        account = helm.deployment(docs, component)["spec"]["template"]["spec"]["serviceAccountName"]
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account, "namespace": helm.NAMESPACE}
        ]
        same_place = [
            role
            for role in helm.find(docs, binding["roleRef"]["kind"], binding["roleRef"]["name"])
            if role["metadata"].get("namespace") == binding["metadata"].get("namespace")
        ]
        assert len(same_place) == 1, binding["metadata"]


@pytest.mark.parametrize("component", ["operator", "autoscaler"])
def test_watched_namespaces_get_roles_and_nothing_namespaced_stays_cluster_wide(
    component: str,
) -> None:
    docs = helm.template({"watchNamespaces": ["models-a", "models-b"]})
    # The autoscaler's Lease Role is its own, in the release namespace (the next test).
    namespaced = [r for r in roles(docs, component, "Role") if not r["metadata"]["name"].endswith(
        "-lease")]  # fmt: skip
    assert sorted(role["metadata"]["namespace"] for role in namespaced) == ["models-a", "models-b"]
    cluster = [rule for role in roles(docs, component, "ClusterRole") for rule in rules(role)]
    assert {resource for rule in cluster for resource in rule["resources"]} <= CLUSTER_SCOPED
    assert all(set(rule["verbs"]) <= {"get", "list", "watch"} for rule in cluster)
    if component == "autoscaler":
        assert cluster == []


def test_all_namespaces_is_one_cluster_role_per_component() -> None:
    docs = helm.template()
    # The one namespaced Role: the autoscaler's own Lease, in the release namespace.
    [lease] = helm.find(docs, "Role")
    assert lease["metadata"] == lease["metadata"] | {"name": "t-llmfleet-autoscaler-lease",
                                                      "namespace": helm.NAMESPACE}  # fmt: skip
    for component in helm.COMPONENTS:
        (role,) = roles(docs, component, "ClusterRole")
        assert role["metadata"]["name"] == f"t-llmfleet-{component}"


@pytest.mark.parametrize(
    ("namespaces", "kind"),
    [(["models-a"], "Role"), ([], "ClusterRole"), (["models-a", "models-b"], "ClusterRole")],
    ids=["one-namespace-role", "all-namespaces", "several-namespaces"],
)
def test_the_gateway_only_lists_and_watches_services_and_endpoint_slices(
    namespaces: list[str], kind: str
) -> None:
    """It discovers one namespace or all of them: with several, its list and watch rules stay
    cluster-wide (read-only), as operator/rbac.yaml's neighbour gateway/rbac.yaml says."""
    docs = helm.template({"watchNamespaces": namespaces})
    (role,) = roles(docs, "gateway", kind)
    assert rules(role) == [
        {"apiGroups": ["llmfleet.dev"], "resources": ["inferenceservices"],
         "verbs": ["list", "watch"]},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
         "verbs": ["list", "watch"]},
    ]  # fmt: skip
    if kind == "Role":
        assert role["metadata"]["namespace"] == "models-a"


@pytest.mark.parametrize(
    ("values", "present", "absent"),
    [
        pytest.param({}, {"nodes", "clusterkopfpeerings", "customresourcedefinitions"},
                     {"namespaces", "kopfpeerings"}, id="all-namespaces"),
        pytest.param({"watchNamespaces": ["a"]},
                     {"nodes", "namespaces", "kopfpeerings", "customresourcedefinitions"},
                     {"clusterkopfpeerings"}, id="namespaces"),
        pytest.param({"operator.readNodes": False}, set(), {"nodes"}, id="no-nodes"),
        pytest.param({"operator.peering": False, "operator.replicas": 1}, set(),
                     {"clusterkopfpeerings", "kopfpeerings"}, id="standalone"),
    ],
)  # fmt: skip
def test_the_operator_reads_only_what_its_mode_needs(
    values: dict[str, Any], present: set[str], absent: set[str]
) -> None:
    docs = helm.template(values)
    granted = {
        resource
        for kind in ("Role", "ClusterRole")
        for role in roles(docs, "operator", kind)
        for rule in rules(role)
        for resource in rule["resources"]
    }
    assert present <= granted
    assert not absent & granted


def test_standalone_operator_runs_without_peering() -> None:
    docs = helm.template({"operator.peering": False, "operator.replicas": 1})
    container = helm.deployment(docs, "operator")["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == ["--standalone"]


def test_the_operator_may_write_and_watch_every_kind_its_code_does() -> None:
    """Against the operator's own tables: what it writes (kube.PLURALS, server-side apply:
    create + patch; children also pruned and listed) and what it watches (watched.py)."""
    docs = helm.template()
    (role,) = roles(docs, "operator", "ClusterRole")
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in rules(role):
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    versions = {kind: version for version, kind in
                [*operator_kube.CHILD_KINDS, operator_kube.MONITOR_KIND]}  # fmt: skip
    for kind, plural in operator_kube.PLURALS.items():
        group = versions.get(kind, "v1").rpartition("/")[0]
        wanted = {"patch"} | ({"create", "delete", "list"} if kind in versions else set())
        assert wanted <= granted.get((group, plural), set()), kind
    for api_version, kind in [POD, *operator_kube.CHILD_KINDS, operator_kube.MONITOR_KIND]:
        plural = operator_kube.PLURALS[kind]
        assert {"list", "watch"} <= granted.get((api_version.rpartition("/")[0], plural), set())
