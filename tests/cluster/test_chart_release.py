"""The chart on the real local cluster: the API server's dry run of everything it renders, and a
release's life: install, the components at work with their own accounts, upgrade, uninstall.

kwok runs no process in a pod, so the release's component pods are Ready and do nothing. To see
the chart's RBAC at work, the test runs `llmfleet operator`, `autoscaler` and `gateway` here,
each with the environment of its Deployment as the API server holds it and a token of its
ServiceAccount (as the kubelet would mount it): a sample service becomes Ready, the autoscaler
writes its decision, the gateway reads its API keys Secret and lists the model. Nothing here
runs with the test's admin rights but the checks.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmfleet.crds import render
from tests.chart import cluster, helm
from tests.cluster.kube import Kube, install_crds, wait_ready
from tests.cluster.operator_process import CliProcess
from tests.crds.cases import SAMPLES_DIR

pytestmark = pytest.mark.cluster

SUFFIX = os.getpid() % 10000
SAMPLE, MODEL = "qwen-7b-spares", "Qwen/Qwen2.5-7B-Instruct"  # e2e/samples/spares.yaml
KEY = "sk-chart-test"
CHILD_KINDS = ["deployments", "replicasets", "services", "configmaps", "poddisruptionbudgets",
               "networkpolicies", "pods"]  # fmt: skip
"""What an InferenceService owns (directly, or through its Deployments)."""
HTTPROUTE_CRD = (
    Path(__file__).parents[1] / "chart" / "gateway-api-crds"
    / "gateway.networking.k8s.io_httproutes.yaml"
)  # fmt: skip
"""Gateway API's HTTPRoute CRD (v1.3.0, see its README), installed for the dry run: the local
cluster has no Gateway API of its own. ServiceMonitors and PrometheusRules are not rendered at
all without the monitoring.coreos.com/v1 API (test_chart_monitoring.py installs that one)."""


@contextmanager
def httproute_api(kube: Kube) -> Iterator[None]:
    kube.kubectl("apply", "--server-side", "-f", str(HTTPROUTE_CRD))
    kube.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                 "crd/httproutes.gateway.networking.k8s.io")  # fmt: skip
    try:
        yield
    finally:
        kube.run("delete", "-f", str(HTTPROUTE_CRD), "--wait=true", "--timeout=60s")


REFUSALS = ("forbidden", "Forbidden", "403", "Not enough permissions")


@contextmanager
def namespaces(kube: Kube, *names: str) -> Iterator[tuple[str, ...]]:
    for name in names:
        kube.kubectl("create", "namespace", name)
    try:
        yield names
    finally:
        for name in names:
            kube.run("delete", "namespace", name, "--wait=false")


@pytest.mark.parametrize(
    "files", [pytest.param([], id="defaults"), pytest.param([helm.VALUES_FULL], id="values-full")]
)
def test_rendered_manifests_pass_the_api_servers_dry_run(kube: Kube, files: list[Path]) -> None:
    tag = "full" if files else "defaults"
    names = [f"dry-{tag}-{key}-{SUFFIX}" for key in ("release", "a", "b", "grafana")]
    with namespaces(kube, *names), httproute_api(kube):
        # values-full's namespaces, as ones that exist here.
        values = {"watchNamespaces": names[1:3], "monitoring.dashboards.namespace": names[3]}
        checked = helm.template(values if files else {}, files=files, namespace=names[0])
        assert len(checked) >= 20
        if files:  # values-full has the optional HTTPRoute: the real API validates it too
            assert "HTTPRoute" in {doc["kind"] for doc in checked}
        answer = kube.kubectl(
            "apply", "--server-side", "--dry-run=server", "--force-conflicts",
            "--field-manager=chart-dry-run", "-f", "-",
            stdin="\n---\n".join(json.dumps(doc) for doc in checked),
        )  # fmt: skip
        lines = [line for line in answer.splitlines() if line.strip()]
        assert len(lines) == len(checked), answer
        assert all(line.endswith("(server dry run)") for line in lines), answer


def test_install_run_upgrade_and_uninstall(kube: Kube, tmp_path: Path) -> None:
    release = f"chart-{SUFFIX}"
    system, apps = f"chart-system-{SUFFIX}", f"chart-apps-{SUFFIX}"
    values = {"watchNamespaces": [apps], "gateway.apiKeys.tenants": {"demo": {"keys": [KEY]}}}
    with ExitStack() as stack:
        stack.enter_context(cluster.cpu_node_up(kube))
        stack.enter_context(namespaces(kube, system, apps))
        cluster.adopt_crds(kube, release, system)
        stack.callback(helm.helm, "uninstall", release, "-n", system, check=False,
                       kubeconfig=kube.kubeconfig)  # fmt: skip
        notes = cluster.install(kube, release, system, values, "--wait", "--timeout=180s")
        _installed(kube, release, system, apps, notes)
        _components_at_work(kube, release, system, apps, tmp_path)
        children = kube.wait_for(lambda: _settled_children(kube, apps), 60, "children at rest")
        _upgrade_rolls_only_the_components(kube, release, system, values)
        assert _children(kube, apps) == children, "the upgrade touched the service's children"
        _uninstall_keeps_services(kube, release, system, apps, children)


def _installed(kube: Kube, release: str, system: str, apps: str, notes: str) -> None:
    prefix = f"{release}-llmfleet"
    for component in helm.COMPONENTS:
        deployment = kube.get("deployment", f"{prefix}-{component}", "-n", system)
        assert deployment["status"].get("availableReplicas") == deployment["spec"]["replicas"]
        kube.kubectl("get", "serviceaccount", f"{prefix}-{component}", "-n", system)
    for component in ("operator", "autoscaler"):  # a Role where they work, nothing elsewhere
        kube.kubectl("get", "role,rolebinding", f"{prefix}-{component}", "-n", apps)
    assert kube.ok("get", "clusterrole", f"{prefix}-operator")  # its cluster-scoped reads
    assert not kube.ok("get", "clusterrole", f"{prefix}-autoscaler")
    for crd in (render.CRD_NAME, "kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev"):
        kube.kubectl("get", "crd", crd)
    # NOTES.txt: how to reach the gateway and send a first request with a key.
    assert f"kubectl port-forward -n {system} svc/{prefix}-gateway 8080:80" in notes
    assert "Authorization: Bearer $LLMFLEET_KEY" in notes
    assert f"kubectl wait -n {apps} --for=condition=Ready llmsvc/llama-8b" in notes


@contextmanager
def _as_component(
    kube: Kube, system: str, deployment: str, log: Path, *args: str
) -> Iterator[CliProcess]:
    """`llmfleet COMPONENT` with the Deployment's command, args and environment, and a token
    of the Deployment's ServiceAccount."""
    body = kube.get("deployment", deployment, "-n", system)
    pod = body["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    command = [*container["command"][1:], *container.get("args", []), *args]
    config = cluster.token_kubeconfig(
        kube, system, pod["serviceAccountName"], log.with_suffix(".kubeconfig")
    )
    env = {**cluster.deployed_env(kube, system, deployment), "KUBECONFIG": str(config)}
    process = CliProcess(log, command[0], *command[1:], env=env)
    try:
        yield process
    finally:
        process.stop()


def _components_at_work(kube: Kube, release: str, system: str, apps: str, logs: Path) -> None:
    prefix = f"{release}-llmfleet"
    with ExitStack() as stack:
        operator = stack.enter_context(
            _as_component(kube, system, f"{prefix}-operator", logs / "operator.log")
        )
        gateway = stack.enter_context(
            _as_component(kube, system, f"{prefix}-gateway", logs / "gateway.log")
        )
        kube.kubectl("apply", "--server-side", "-n", apps, "-f", str(SAMPLES_DIR / "spares.yaml"))
        wait_ready(kube, apps, SAMPLE, timeout=120)
        endpoint = kube.get(f"inferenceservices.llmfleet.dev/{SAMPLE}", "-n", apps)["status"]
        assert endpoint.get("endpoint") == f"http://{prefix}-gateway.{system}.svc"

        # The gateway read its keys from the release's Secret and lists the service's model.
        port = cluster.deployed_env(kube, system, f"{prefix}-gateway")["LLMFLEET_GATEWAY_PORT"]
        url = f"http://127.0.0.1:{port}/v1/models"
        models = kube.wait_for(lambda: _models(url, KEY), 60, f"{MODEL} on {url}")
        assert MODEL in models
        assert httpx.get(url, timeout=5).status_code == 401

        # One autoscaler pass: it lists the service and its pods and writes status.autoscaling
        # (Prometheus is out of reach here, so the decision holds the counts and says why).
        autoscaler_log = logs / "autoscaler.log"
        with _as_component(
            kube, system, f"{prefix}-autoscaler", autoscaler_log, "--once"
        ) as autoscaler:
            assert autoscaler.wait(120) == 0, autoscaler.text()
        status = kube.get(f"inferenceservices.llmfleet.dev/{SAMPLE}", "-n", apps)["status"]
        assert status.get("autoscaling", {}).get("pools"), autoscaler.text()
        for process in (operator, gateway, autoscaler):
            refused = [line for line in process.text().splitlines()
                       if any(word in line for word in REFUSALS)]  # fmt: skip
            assert not refused, f"{process.log.name}: the API server refused:\n" + "\n".join(
                refused
            )


def _models(url: str, key: str) -> list[str]:
    try:
        answer = httpx.get(url, headers={"Authorization": f"Bearer {key}"}, timeout=5)
    except httpx.TransportError:
        return []
    if answer.status_code != 200:
        return []
    return [model["id"] for model in answer.json()["data"]]


def _children(kube: Kube, apps: str) -> dict[tuple[str, str], tuple[str, str]]:
    """(kind, name) -> (uid, resourceVersion) of everything the sample service owns."""
    found = cluster.objects(kube, CHILD_KINDS, "-n", apps)
    assert {kind for kind, _ in found} >= {"Deployment", "Pod", "Service", "ConfigMap"}
    return {key: (item["metadata"]["uid"], item["metadata"]["resourceVersion"])
            for key, item in found.items()}  # fmt: skip


def _settled_children(kube: Kube, apps: str) -> dict[tuple[str, str], tuple[str, str]] | None:
    """`_children` once no write has changed them for 2 s (a pod's status or a Deployment's
    may still be settling when the components stop), else None."""
    first = _children(kube, apps)
    time.sleep(2)
    return first if _children(kube, apps) == first else None


def _template_hashes(kube: Kube, system: str) -> dict[str, set[str]]:
    """Component -> pod-template-hash of its ReplicaSets that have pods."""
    hashes: dict[str, set[str]] = {}
    for item in kube.get("replicasets", "-n", system)["items"]:
        if item["spec"].get("replicas"):
            labels = item["metadata"]["labels"]
            component = labels["app.kubernetes.io/component"]
            hashes.setdefault(component, set()).add(labels["pod-template-hash"])
    return hashes


def _upgrade_rolls_only_the_components(
    kube: Kube, release: str, system: str, values: dict[str, Any]
) -> None:
    before = _template_hashes(kube, system)
    changed = {
        **values,
        "operator.settings": {"metricsHost": "0.0.0.0", "drainSeconds": 60},
        "autoscaler.settings": {"metricsHost": "0.0.0.0", "intervalSeconds": 30},
        "gateway.settings": {"host": "0.0.0.0", "logLevel": "DEBUG"},
    }
    cluster.install(kube, release, system, changed, "--wait", "--timeout=180s", command="upgrade")

    def settled() -> dict[str, set[str]] | None:
        hashes = _template_hashes(kube, system)
        return hashes if all(len(found) == 1 for found in hashes.values()) else None

    after = kube.wait_for(settled, 60, "the old ReplicaSets scaled down")
    assert before.keys() == after.keys() == set(helm.COMPONENTS)
    for component in helm.COMPONENTS:
        assert not before[component] & after[component], f"the {component} did not roll"
    env = cluster.deployed_env(kube, system, f"{release}-llmfleet-operator")
    assert env["LLMFLEET_OPERATOR_DRAIN_SECONDS"] == "60"


def _uninstall_keeps_services(
    kube: Kube, release: str, system: str, apps: str, children: dict[Any, Any]
) -> None:
    """`crds.keep` (the default): the CRDs stay, so do the services and everything they own;
    only the components (and their accounts and RBAC) go."""
    answer = helm.helm("uninstall", release, "-n", system, "--wait", kubeconfig=kube.kubeconfig)
    assert "kept due to the resource policy" in answer.stdout
    prefix = f"{release}-llmfleet"
    for crd in (render.CRD_NAME, "kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev"):
        kube.kubectl("get", "crd", crd)
    kube.kubectl("get", f"inferenceservices.llmfleet.dev/{SAMPLE}", "-n", apps)
    assert _children(kube, apps).keys() == children.keys()

    def left() -> list[str]:
        """The release's own objects still there (one `get` per object: a `get` of two
        kinds fails as soon as either is gone)."""
        found = [f"{kind}/{prefix}-{component}" for component in helm.COMPONENTS
                 for kind in ("deployment", "serviceaccount")
                 if kube.ok("get", kind, f"{prefix}-{component}", "-n", system)]  # fmt: skip
        if kube.ok("get", "clusterrole", f"{prefix}-operator"):
            found.append(f"clusterrole/{prefix}-operator")
        if kube.ok("get", "role", f"{prefix}-operator", "-n", apps):
            found.append(f"role/{prefix}-operator in {apps}")
        return found

    kube.wait_for(lambda: not left(), 60, "the release's components, accounts and RBAC gone")


def test_uninstall_without_keep_deletes_every_service(kube: Kube) -> None:
    """`crds.keep: false`: uninstalling deletes the CRDs, so every InferenceService. What a
    service owned is collected only once the garbage collector can verify its owner is gone:
    if the CRD's API vanished first, that waits until the CRD exists again (kubernetes#102641),
    which README's "Install with Helm" says, with how to avoid it."""
    release, system, apps = f"nokeep-{SUFFIX}", f"nokeep-system-{SUFFIX}", f"nokeep-{SUFFIX}"
    with namespaces(kube, system, apps):
        cluster.adopt_crds(kube, release, system)
        values = {"crds.keep": False, "operator.replicas": 0, "gateway.replicas": 0,
                  "autoscaler.enabled": False}  # fmt: skip
        cluster.install(kube, release, system, values)
        try:
            kube.kubectl("apply", "-n", apps, "-f", str(SAMPLES_DIR / "unified.yaml"))
            service = kube.get("inferenceservices.llmfleet.dev/llama-8b", "-n", apps)
            owned = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
                "name": "owned-by-llama", "namespace": apps, "ownerReferences": [{
                    "apiVersion": service["apiVersion"], "kind": service["kind"],
                    "name": "llama-8b", "uid": service["metadata"]["uid"], "controller": True,
                }]}}  # fmt: skip
            kube.kubectl("apply", "-f", "-", stdin=json.dumps(owned))
            answer = helm.helm("uninstall", release, "-n", system, "--wait",
                               kubeconfig=kube.kubeconfig)  # fmt: skip
            assert "kept due to the resource policy" not in answer.stdout
            kube.wait_for(lambda: not kube.ok("get", "crd", render.CRD_NAME), 60, "the CRD gone")
        finally:
            helm.helm("uninstall", release, "-n", system, check=False, kubeconfig=kube.kubeconfig)
            # Other tests expect the CRDs: put them back once the deletion is through.
            kube.wait_for(lambda: not _deleting(kube, render.CRD_NAME), 90, "the CRD deleted")
            install_crds(kube)
        assert not kube.ok("get", "inferenceservices.llmfleet.dev/llama-8b", "-n", apps)
        kube.wait_for(
            lambda: not kube.ok("get", "configmap", "owned-by-llama", "-n", apps),
            90, "the service's ConfigMap collected once the CRD is back",
        )  # fmt: skip


def _deleting(kube: Kube, crd: str) -> bool:
    found = kube.run("get", "crd", crd, "-o", "jsonpath={.metadata.deletionTimestamp}")
    return found.returncode == 0 and bool(found.stdout.strip())
