"""Least privilege as the API server applies it: two releases of the chart (every namespace; one
watched namespace), each component's ServiceAccount impersonated with `kubectl auth can-i`.

Each row is something a component needs (it must be allowed) or something it has no business
doing (it must be refused): reading Secrets other than the API keys, writing what it does not
manage, acting in a namespace it is not given. test_chart_release.py runs the components
themselves with their accounts' tokens.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.chart import cluster, helm
from tests.cluster.kube import Kube, install_crds

pytestmark = pytest.mark.cluster

SUFFIX = os.getpid() % 10000
NAMESPACES = {key: f"rbac-{key}-{SUFFIX}" for key in ("all", "ns", "apps", "other")}
"""Release namespaces (`all`: every namespace; `ns`: watches `apps`), a watched namespace and
one nobody is given."""
RELEASES = {"all": f"rbac-all-{SUFFIX}", "ns": f"rbac-ns-{SUFFIX}"}

ISVC = "inferenceservices.llmfleet.dev"
CRD = "customresourcedefinitions.apiextensions.k8s.io"
IN_APPS, IN_OTHER, ANYWHERE = ("-n", "{apps}"), ("-n", "{other}"), ("-A",)
OWN = ("-n", "{release}")
CLUSTER: tuple[str, ...] = ()

OPERATOR_NEEDS = [
    ("get", ISVC), ("list", ISVC), ("watch", ISVC), ("patch", f"{ISVC}#status"),
    ("create", "deployments.apps"), ("patch", "deployments.apps"), ("delete", "deployments.apps"),
    ("create", "services"), ("patch", "configmaps"), ("delete", "configmaps"),
    ("create", "poddisruptionbudgets.policy"), ("delete", "poddisruptionbudgets.policy"),
    ("create", "networkpolicies.networking.k8s.io"),
    ("update", "networkpolicies.networking.k8s.io"),
    ("delete", "networkpolicies.networking.k8s.io"),
    ("list", "pods"), ("watch", "pods"), ("patch", "pods"),
    ("list", "endpointslices.discovery.k8s.io"), ("create", "events"),
]  # fmt: skip
"""In every namespace it is given. (ServiceMonitors are left out: without the Prometheus
Operator's CRD kubectl cannot resolve the resource; test_rbac_render.py checks that rule.)"""
OPERATOR_MUST_NOT = [
    ("get", "secrets"), ("list", "secrets"), ("create", "pods"), ("delete", "pods"),
    ("create", ISVC), ("delete", ISVC), ("patch", ISVC), ("update", ISVC),
    ("update", "deployments.apps"),
    ("patch", "replicasets.apps"), ("create", "serviceaccounts#token"),
    ("create", "rolebindings.rbac.authorization.k8s.io"),
]  # fmt: skip
OPERATOR_CLUSTER_MUST_NOT = [
    ("create", CRD), ("delete", CRD), ("patch", "nodes"), ("delete", "namespaces"),
    ("create", "clusterroles.rbac.authorization.k8s.io"),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
]  # fmt: skip
AUTOSCALER_NEEDS = [("list", ISVC), ("watch", ISVC), ("patch", f"{ISVC}#status"),
                    ("list", "pods"), ("watch", "pods"), ("create", "events")]  # fmt: skip
AUTOSCALER_MUST_NOT = [
    ("patch", ISVC), ("update", ISVC), ("patch", "pods"), ("delete", "pods"),
    ("patch", "deployments.apps"), ("get", "secrets"), ("list", "secrets"),
]  # fmt: skip
GATEWAY_NEEDS = [("list", ISVC), ("watch", ISVC), ("list", "endpointslices.discovery.k8s.io"),
                 ("watch", "endpointslices.discovery.k8s.io")]  # fmt: skip
GATEWAY_MUST_NOT = [
    ("patch", ISVC), ("patch", f"{ISVC}#status"), ("list", "pods"), ("get", "configmaps"),
    ("create", "events"), ("list", "secrets"), ("get", "secrets"),
]  # fmt: skip


def rows() -> Iterator[tuple[str, str, str, str, tuple[str, ...], bool]]:
    """(release, component, verb, resource, where, allowed)."""
    for release, given in (("all", (IN_APPS, ANYWHERE)), ("ns", (IN_APPS,))):
        for where in given:
            yield from ((release, "operator", v, r, where, True) for v, r in OPERATOR_NEEDS)
            yield from ((release, "autoscaler", v, r, where, True) for v, r in AUTOSCALER_NEEDS)
            yield from ((release, "gateway", v, r, where, True) for v, r in GATEWAY_NEEDS)
        for where in (IN_APPS, ANYWHERE):
            yield from ((release, "operator", v, r, where, False) for v, r in OPERATOR_MUST_NOT)
            yield from ((release, "autoscaler", v, r, where, False) for v, r in AUTOSCALER_MUST_NOT)
            yield from ((release, "gateway", v, r, where, False) for v, r in GATEWAY_MUST_NOT)
        yield from (
            (release, "operator", v, r, CLUSTER, False) for v, r in OPERATOR_CLUSTER_MUST_NOT
        )
        # Cluster-scoped reads of the operator (operator/rbac.yaml says why each one).
        yield release, "operator", "list", "nodes", CLUSTER, True
        yield release, "operator", "watch", CRD, CLUSTER, True
        yield (
            release,
            "operator",
            "get",
            f"{CRD}/servicemonitors.monitoring.coreos.com",
            CLUSTER,
            True,
        )
        # The API keys: the one Secret named, in the release's namespace, get only.
        yield release, "gateway", "get", "secrets/keys", OWN, True
        yield release, "gateway", "get", "secrets/other", OWN, False
        yield release, "gateway", "watch", "secrets/keys", OWN, False
        yield release, "gateway", "get", "secrets/keys", IN_APPS, False
        yield release, "operator", "get", "secrets/keys", OWN, False
    # Every namespace: peering on a cluster object, no namespace list needed.
    yield "all", "operator", "patch", "clusterkopfpeerings.kopf.dev", CLUSTER, True
    yield "all", "operator", "list", "namespaces", CLUSTER, False
    # One namespace: nothing outside it, peering in it, namespaces listed (kopf).
    for component, needs in (("operator", OPERATOR_NEEDS), ("autoscaler", AUTOSCALER_NEEDS),
                             ("gateway", GATEWAY_NEEDS)):  # fmt: skip
        for where in (IN_OTHER, ANYWHERE):
            yield from (("ns", component, v, r, where, False) for v, r in needs)
    yield "ns", "operator", "patch", "kopfpeerings.kopf.dev", IN_APPS, True
    yield "ns", "operator", "patch", "kopfpeerings.kopf.dev", IN_OTHER, False
    yield "ns", "operator", "patch", "clusterkopfpeerings.kopf.dev", CLUSTER, False
    yield "ns", "operator", "list", "namespaces", CLUSTER, True


ACCOUNTS = [(release, component) for release in RELEASES for component in
            ("operator", "autoscaler", "gateway")]  # fmt: skip


@pytest.fixture(scope="module")
def releases(kube: Kube) -> Iterator[dict[str, str]]:
    """Both releases installed (without CRDs: the test applies them, as other tests do; kubectl
    resolves `inferenceservices.llmfleet.dev` through discovery), removed after."""
    install_crds(kube)
    for name in NAMESPACES.values():
        kube.kubectl("create", "namespace", name)
    keys = {"gateway.apiKeys.existingSecret": "keys", "crds.install": False}
    try:
        cluster.install(kube, RELEASES["all"], NAMESPACES["all"], keys)
        cluster.install(kube, RELEASES["ns"], NAMESPACES["ns"],
                        {**keys, "watchNamespaces": [NAMESPACES["apps"]]})  # fmt: skip
        yield NAMESPACES
    finally:
        for key, release in RELEASES.items():
            helm.helm("uninstall", release, "-n", NAMESPACES[key],
                              kubeconfig=kube.kubeconfig, check=False)  # fmt: skip
        for name in NAMESPACES.values():
            kube.run("delete", "namespace", name, "--wait=false")


@pytest.mark.parametrize(("release", "component"), ACCOUNTS, ids=[f"{r}-{c}" for r, c in ACCOUNTS])
def test_service_account_permissions(
    kube: Kube, releases: dict[str, str], release: str, component: str
) -> None:
    names = {**releases, "release": releases[release]}
    account = f"{releases[release]}:{RELEASES[release]}-llmfleet-{component}"
    checked, wrong = 0, []
    for row_release, row_component, verb, resource, where, allowed in rows():
        if (row_release, row_component) != (release, component):
            continue
        args = [arg.format(**names) for arg in where]
        checked += 1
        if cluster.can_i(kube, account, verb, resource, *args) is not allowed:
            scope = " ".join(args) or "(cluster)"
            wrong.append(f"{'should' if allowed else 'must not'} {verb} {resource} {scope}")
    assert checked > 5
    assert not wrong, f"{account}:\n" + "\n".join(wrong)
