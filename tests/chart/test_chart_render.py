"""charts/llmfleet through the real helm: lint, render, and what the rendered objects must hold.

The API server's judgement of the same manifests, and the RBAC as the API server applies it, are
in test_chart_release.py and test_rbac_chart.py.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmfleet.crds import render
from tests.chart import helm
from tests.chart.cluster import CRD_KINDS

RENDERS = [
    pytest.param([], id="defaults"),
    pytest.param([helm.VALUES_FULL], id="values-full"),
]
COMMON_LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/instance",
                 "app.kubernetes.io/version", "helm.sh/chart")  # fmt: skip
COMPONENT_KINDS = {
    "Deployment", "ServiceAccount", "Service", "Role", "RoleBinding", "ClusterRole",
    "ClusterRoleBinding", "PodDisruptionBudget", "Secret", "Ingress", "HTTPRoute",
}  # fmt: skip
"""Kinds this chart renders per component (each carries app.kubernetes.io/component)."""


def semver(version: str) -> str:
    """A PEP 440 release as the SemVer Helm requires: 0.1.0.dev0 -> 0.1.0-dev0."""
    match = re.fullmatch(r"(\d+\.\d+\.\d+)(?:\.?((?:a|b|rc|dev)\d+))?(?:\.(dev\d+))?", version)
    assert match, f"cannot write {version} as SemVer: extend semver()"
    release, pre, dev = match.groups()
    suffix = ".".join(part for part in (pre, dev) if part)
    return f"{release}-{suffix}" if suffix else release


@pytest.mark.parametrize(
    ("pep440", "expected"),
    [("0.1.0", "0.1.0"), ("0.1.0.dev0", "0.1.0-dev0"), ("1.2.0rc1", "1.2.0-rc1"),
     ("1.2.0rc1.dev3", "1.2.0-rc1.dev3")],
)  # fmt: skip
def test_semver(pep440: str, expected: str) -> None:
    assert semver(pep440) == expected


def test_chart_and_app_version_follow_the_package() -> None:
    package = tomllib.loads((helm.ROOT / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((helm.CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == package
    assert chart["version"] == semver(package)


@pytest.mark.parametrize("files", RENDERS)
def test_helm_lint_passes(files: list[Path]) -> None:
    result = helm.helm("lint", "--strict", str(helm.CHART), *helm.value_args(files=files))
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("files", RENDERS)
def test_every_object_carries_the_release_labels(files: list[Path]) -> None:
    """Monitoring objects included (rendered where the Prometheus Operator's API exists)."""
    docs = helm.template(files=files, release="edge", api_versions=["monitoring.coreos.com/v1"])
    assert {"PodMonitor", "PrometheusRule"} <= {doc["kind"] for doc in docs}
    for doc in docs:
        labels = doc["metadata"].get("labels") or {}
        what = f"{doc['kind']} {doc['metadata']['name']}"
        assert all(key in labels for key in COMMON_LABELS), what
        assert labels["app.kubernetes.io/name"] == "llmfleet", what
        assert labels["app.kubernetes.io/instance"] == "edge", what
        if doc["kind"] in COMPONENT_KINDS:
            assert labels.get("app.kubernetes.io/component") in helm.COMPONENTS, what


@pytest.mark.parametrize("files", RENDERS)
@pytest.mark.parametrize("component", helm.COMPONENTS)
def test_components_run_locked_down(files: list[Path], component: str) -> None:
    docs = helm.template(files=files)
    deployment = helm.deployment(docs, component)
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == (
        component
    )
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["serviceAccountName"] == f"{deployment['metadata']['name']}"
    (container,) = pod["containers"]
    assert container["command"] == ["llmfleet", component]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["privileged"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert {"cpu", "memory"} <= container["resources"]["requests"].keys()
    assert "memory" in container["resources"]["limits"]
    # The read-only root filesystem leaves the process /tmp, on an emptyDir of its own.
    tmp = next(m for m in container["volumeMounts"] if m["mountPath"] == "/tmp")
    assert "emptyDir" in next(v for v in pod["volumes"] if v["name"] == tmp["name"])


def _crds(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for doc in helm.find(docs, "CustomResourceDefinition")}


def test_the_chart_crds_are_the_committed_manifests() -> None:
    copies = sorted(path.name for path in render.CHART_CRDS_DIR.glob("*.yaml"))
    assert copies == sorted(path.name for path in render.MANIFESTS_DIR.glob("*.yaml"))
    for name in copies:
        assert (render.CHART_CRDS_DIR / name).read_text() == (
            render.MANIFESTS_DIR / name
        ).read_text(), f"charts/llmfleet/crd-manifests/{name} is stale: run `llmfleet crds render`"
    manifests = {
        (doc["kind"], doc["metadata"]["name"]): doc
        for path in render.MANIFESTS_DIR.glob("*.yaml")
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    }
    docs = helm.template()
    rendered = {
        (kind, found["metadata"]["name"]): found
        for kind in CRD_KINDS
        for found in helm.find(docs, kind)
    }
    assert rendered.keys() == manifests.keys()
    for name, crd in rendered.items():
        labels = crd["metadata"].pop("labels")
        assert crd["metadata"].pop("annotations") == {"helm.sh/resource-policy": "keep"}
        assert labels.items() >= manifests[name]["metadata"].pop("labels").items()
        assert crd == manifests[name], f"{name} changed on its way through the template"


@pytest.mark.parametrize(
    ("crds", "count", "keep"),
    [({"install": True, "keep": True}, 3, True), ({"install": True, "keep": False}, 3, False),
     ({"install": False, "keep": True}, 0, None)],
    ids=["install-keep", "install-no-keep", "no-install"],
)  # fmt: skip
def test_crd_toggles(crds: dict[str, bool], count: int, keep: bool | None) -> None:
    rendered = _crds(helm.template({"crds": crds}))
    assert len(rendered) == count
    for crd in rendered.values():
        annotations = crd["metadata"].get("annotations") or {}
        assert (annotations.get("helm.sh/resource-policy") == "keep") is keep


REFUSED = [
    ("replicas-without-peering", {"operator.peering": False, "operator.replicas": 2},
     "operator.replicas > 1 needs operator.peering"),
    ("keys-twice", {"gateway.apiKeys": {"existingSecret": "k", "tenants": {"a": {"keys": ["x"]}}}},
     "give either existingSecret or tenants, not both"),
    ("tenant-without-keys", {"gateway.apiKeys.tenants": {"a": {"keys": []}}}, "minItems"),
    ("ingress-without-hosts", {"gateway.ingress.enabled": True},
     "gateway.ingress.enabled needs at least one entry"),
    ("route-without-parent", {"gateway.httpRoute.enabled": True},
     "gateway.httpRoute.enabled needs gateway.httpRoute.parentRefs"),
    ("bad-namespace", {"watchNamespaces": ["Models_A"]}, "/watchNamespaces/0"),
    ("namespace-twice", {"watchNamespaces": ["a", "a"]}, "/watchNamespaces"),
    ("unknown-value", {"gateway.replica": 3}, "additional properties 'replica'"),
    ("no-service-account-name", {"gateway.serviceAccount.create": False},
     "gateway.serviceAccount.name is required when gateway.serviceAccount.create is false"),
]  # fmt: skip
"""Values the chart refuses: id, values, what helm's error says."""


@pytest.mark.parametrize(("values", "message"), [pytest.param(v, m, id=i) for i, v, m in REFUSED])
def test_bad_values_are_refused_with_a_reason(values: dict[str, Any], message: str) -> None:
    assert message in helm.template_error(values)


@pytest.mark.parametrize(
    ("values", "url"),
    [
        pytest.param({}, "http://t-llmfleet-gateway.llmfleet.svc", id="service"),
        pytest.param({"gateway.service.port": 8080}, "http://t-llmfleet-gateway.llmfleet.svc:8080",
                     id="service-port"),
        pytest.param({"gateway.ingress": {"enabled": True, "hosts": [{"host": "llm.example"}]}},
                     "http://llm.example", id="ingress"),
        pytest.param({"gateway.ingress": {"enabled": True, "hosts": [{"host": "llm.example"}],
                                          "tls": [{"hosts": ["llm.example"]}]}},
                     "https://llm.example", id="ingress-tls"),
        pytest.param({"operator.gatewayUrl": "https://given.example"}, "https://given.example",
                     id="given"),
        pytest.param({"gateway.enabled": False}, None, id="no-gateway"),
    ],
)  # fmt: skip
def test_the_published_gateway_url(values: dict[str, Any], url: str | None) -> None:
    env = helm.container_env(helm.template(values), "operator")
    assert env.get("LLMFLEET_OPERATOR_GATEWAY_URL") == url


def test_ingress_and_route_lead_to_the_gateway_service() -> None:
    docs = helm.template(files=[helm.VALUES_FULL])
    (service,) = helm.find(docs, "Service", "fleet-gateway")
    (port,) = service["spec"]["ports"]
    assert port["name"] == "http"
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "gateway"
    (ingress,) = helm.find(docs, "Ingress")
    backends = [path["backend"]["service"] for rule in ingress["spec"]["rules"]
                for path in rule["http"]["paths"]]  # fmt: skip
    assert backends == [{"name": "fleet-gateway", "port": {"name": "http"}}] * 2
    assert [rule["host"] for rule in ingress["spec"]["rules"]] == [
        "llm.example.com", "llm-internal.example.com",
    ]  # fmt: skip
    assert ingress["spec"]["ingressClassName"] == "nginx"
    # The HTTPRoute is not checked by the API server here (no Gateway API CRDs in the local
    # cluster), so its shape is checked against the Gateway API v1 spec here.
    (route,) = helm.find(docs, "HTTPRoute")
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    assert route["spec"]["parentRefs"] == [
        {"name": "public", "namespace": "gateway-system", "sectionName": "https"}
    ]
    assert route["spec"]["hostnames"] == ["llm.example.com"]
    (rule,) = route["spec"]["rules"]
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/v1"}}]
    assert rule["backendRefs"] == [{"name": "fleet-gateway", "port": port["port"]}]


def test_api_keys_from_values_become_the_secret_the_gateway_reads() -> None:
    docs = helm.template(files=[helm.VALUES_FULL])
    (secret,) = helm.find(docs, "Secret")
    tenants = yaml.safe_load(secret["stringData"]["tenants.yaml"])
    assert tenants["tenants"]["team-a"]["keys"] == ["sk-a-1", "sk-a-2"]
    env = helm.container_env(docs, "gateway")
    assert env["LLMFLEET_GATEWAY_API_KEYS_SECRET"] == f"llmfleet/{secret['metadata']['name']}"
    assert env["LLMFLEET_GATEWAY_REQUIRE_API_KEYS"] == "true"
    # A change to the keys rolls no pod (no stream is cut): the gateway re-reads the Secret.
    before = helm.deployment(docs, "gateway")["spec"]["template"]
    changed = helm.template({"gateway.apiKeys.tenants": {"a": {"keys": ["new"]}}},
                            files=[helm.VALUES_FULL])  # fmt: skip
    assert helm.deployment(changed, "gateway")["spec"]["template"] == before


@pytest.mark.parametrize(
    ("values", "error"),
    [
        ({"gateway.auth": "apiKeys"}, "gateway.auth is apiKeys (the default) and no keys"),
        ({"gateway.auth": "none", "gateway.apiKeys.existingSecret": "k"},
         "gateway.auth is none but gateway.apiKeys gives keys"),
        ({"gateway.auth": "open"}, "auth"),
        ({"autoscaler.leaderElection": False}, "autoscaler.replicas > 1 needs"),
    ],
    ids=["keys required by default", "none with keys", "unknown auth", "two without a lease"],
)  # fmt: skip
def test_unsafe_defaults_must_be_asked_for(values: dict[str, Any], error: str) -> None:
    assert error in helm.template_error(values)


def test_no_authentication_is_said_explicitly() -> None:
    env = helm.container_env(helm.template({"gateway.auth": "none"}), "gateway")
    assert "LLMFLEET_GATEWAY_REQUIRE_API_KEYS" not in env
    assert "LLMFLEET_GATEWAY_API_KEYS_SECRET" not in env


@pytest.mark.parametrize(
    ("values", "limit_replicas", "grace"),
    [
        ({}, "2", 10 + 600 + 15),
        ({"gateway.replicas": 4, "gateway.preStopSeconds": 5,
          "gateway.shutdownTimeoutSeconds": 120}, "4", 5 + 120 + 15),
    ],
    ids=["defaults", "set"],
)  # fmt: skip
def test_gateway_rollouts_let_streams_finish(
    values: dict[str, Any], limit_replicas: str, grace: int
) -> None:
    """The preStop pause, then the shutdown timeout (the request timeout by default), inside
    the grace period; each replica enforces its share of the tenants' limits."""
    docs = helm.template(values)
    pod = helm.deployment(docs, "gateway")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = helm.container_env(docs, "gateway")
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    shutdown = int(env["LLMFLEET_GATEWAY_SHUTDOWN_TIMEOUT_SECONDS"])
    assert pod["terminationGracePeriodSeconds"] == grace
    assert pre_stop + shutdown < grace
    assert env["LLMFLEET_GATEWAY_LIMIT_REPLICAS"] == limit_replicas


def test_the_autoscaler_runs_two_replicas_under_a_lease() -> None:
    docs = helm.template()
    deployment = helm.deployment(docs, "autoscaler")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    env = helm.container_env(docs, "autoscaler")
    assert env["LLMFLEET_AUTOSCALER_LEADER_ELECTION"] == "true"
    assert env["LLMFLEET_AUTOSCALER_LEASE_NAMESPACE"] == helm.NAMESPACE
    (role,) = [r for r in helm.find(docs, "Role") if r["metadata"]["name"].endswith("-lease")]
    assert role["metadata"]["namespace"] == helm.NAMESPACE
    lease_rule = {"resources": ["leases"], "resourceNames": [env["LLMFLEET_AUTOSCALER_LEASE_NAME"]],
                  "apiGroups": ["coordination.k8s.io"], "verbs": ["get", "update"]}  # fmt: skip
    assert lease_rule in role["rules"]
    single = helm.template({"autoscaler.leaderElection": False, "autoscaler.replicas": 1})
    assert helm.deployment(single, "autoscaler")["spec"]["strategy"] == {"type": "Recreate"}
    assert "LLMFLEET_AUTOSCALER_LEADER_ELECTION" not in helm.container_env(single, "autoscaler")


@pytest.mark.parametrize(
    ("values", "budgets"),
    [
        pytest.param({}, {"operator": 1, "gateway": 1}, id="defaults"),
        pytest.param({"operator.replicas": 1, "gateway.replicas": 1}, {}, id="single-replicas"),
        pytest.param({"gateway.podDisruptionBudget.enabled": False}, {"operator": 1},
                     id="gateway-off"),
    ],
)  # fmt: skip
def test_disruption_budgets(values: dict[str, Any], budgets: dict[str, int]) -> None:
    docs = helm.template(values)
    found = {
        pdb["metadata"]["labels"]["app.kubernetes.io/component"]: pdb["spec"]["minAvailable"]
        for pdb in helm.find(docs, "PodDisruptionBudget")
    }
    assert found == budgets
    for pdb in helm.find(docs, "PodDisruptionBudget"):
        component = pdb["metadata"]["labels"]["app.kubernetes.io/component"]
        selector = helm.deployment(docs, component)["spec"]["selector"]["matchLabels"]
        assert pdb["spec"]["selector"]["matchLabels"] == selector


@pytest.mark.parametrize(
    ("values", "probe_port", "ports"),
    [
        ({}, "admin", {"http": 8080, "admin": 8090}),
        ({"gateway.settings.adminPort": None}, "http", {"http": 8080}),
        ({"files": [helm.VALUES_FULL]}, "admin", {"http": 9080, "admin": 9091}),
    ],
    ids=["defaults: an admin port", "admin port off", "admin-port"],
)
def test_gateway_probes_and_ports_follow_the_admin_port(
    values: dict[str, Any], probe_port: str, ports: dict[str, int]
) -> None:
    """With settings.adminPort (the default), /healthz and /readyz (and /metrics, /docs) answer
    only there; the gateway Service exposes only the API."""
    files = values.pop("files", [])
    docs = helm.template(values, files=files)
    (container,) = helm.deployment(docs, "gateway")["spec"]["template"]["spec"]["containers"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == ports
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": probe_port}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": probe_port}
    labels = helm.deployment(docs, "gateway")["metadata"]["labels"]
    (service,) = [s for s in helm.find(docs, "Service") if s["metadata"]["labels"] == labels]
    assert [port["targetPort"] for port in service["spec"]["ports"]] == ["http"]
