"""The chart on the real local cluster: releases, a node for the components' pods, and
kubeconfigs that authenticate as a component's ServiceAccount."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from llmfleet.core.cluster import nodes
from tests.chart import helm
from tests.cluster.kube import Kube

CPU_NODE = "chart-cpu-0"


@contextmanager
def cpu_node_up(kube: Kube) -> Iterator[str]:
    """The CPU node for the duration of a module; removed after, so that other tests see only
    the GPU nodes they expect (the scheduler's messages count nodes)."""
    node = nodes.cpu_node(CPU_NODE)  # no GPUs, no taints: the components' pods land there
    kube.kubectl("apply", "-f", "-", stdin=json.dumps(node))
    kube.wait_for(
        lambda: kube.ok("wait", "--for=condition=Ready", f"node/{CPU_NODE}", "--timeout=5s"),
        60,
        f"node {CPU_NODE} Ready",
    )
    try:
        yield CPU_NODE
    finally:
        kube.kubectl("delete", "node", CPU_NODE, "--wait=false")


CRD_KINDS = {
    "CustomResourceDefinition": "crd",
    "ValidatingAdmissionPolicy": "validatingadmissionpolicy",
    "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybinding",
}
"""What the chart's CRD templates install (crd-manifests/: the CRDs and the admission policy of
the annotations), kind -> kubectl's resource name."""


def adopt_crds(kube: Kube, release: str, namespace: str) -> None:
    """Let `release` take over CRDs (and their admission policy) that exist without being its
    own (applied by other tests with kubectl, or left by an uninstalled release with
    `crds.keep`): Helm adopts an object whose release annotations and managed-by label name it.
    Users do the same (README)."""
    rendered = helm.template()
    for kind, resource in CRD_KINDS.items():
        for found in helm.find(rendered, kind):
            name = found["metadata"]["name"]
            if not kube.ok("get", resource, name):
                continue
            kube.kubectl(
                "label", "--overwrite", resource, name, "app.kubernetes.io/managed-by=Helm"
            )
            kube.kubectl(
                "annotate", "--overwrite", resource, name, f"meta.helm.sh/release-name={release}",
                f"meta.helm.sh/release-namespace={namespace}",
            )  # fmt: skip


def install(
    kube: Kube,
    release: str,
    namespace: str,
    values: Mapping[str, Any],
    *flags: str,
    command: str = "install",
) -> str:
    """`helm install|upgrade` of the chart into `namespace` (which exists); helm's stdout."""
    result = helm.helm(
        command, release, str(helm.CHART), "--namespace", namespace,
        *helm.value_args(values), *flags, kubeconfig=kube.kubeconfig, timeout=400,
    )  # fmt: skip
    return result.stdout


def uninstall(kube: Kube, release: str, namespace: str, *flags: str) -> None:
    helm.helm("uninstall", release, "--namespace", namespace, *flags, kubeconfig=kube.kubeconfig)


def token_kubeconfig(kube: Kube, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig for the cluster that authenticates with a token of ServiceAccount
    `namespace/account` (TokenRequest, as the kubelet mounts one in a pod, and as the local pod
    runner gave the chart's pods): whatever a process does with it, the API server allows only
    what that account's RBAC allows."""
    admin = yaml.safe_load(kube.kubeconfig.read_text())
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
    )
    answer: Any = client.CoreV1Api(kube.api()).create_namespaced_service_account_token(
        account, namespace, request
    )
    context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])
    cluster = next(c for c in admin["clusters"] if c["name"] == context["context"]["cluster"])
    user = f"system:serviceaccount:{namespace}:{account}"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": user, "user": {"token": answer.status.token}}],
        "contexts": [{"name": user, "context": {"cluster": cluster["name"], "user": user}}],
        "current-context": user,
    }
    path.write_text(yaml.safe_dump(config))
    return path


def deployed_env(kube: Kube, namespace: str, deployment: str) -> dict[str, str]:
    """The environment of a Deployment's container as the API server holds it."""
    body = kube.get("deployment", deployment, "-n", namespace)
    (container,) = body["spec"]["template"]["spec"]["containers"]
    return {entry["name"]: entry["value"] for entry in container.get("env") or []}


def can_i(kube: Kube, account: str, verb: str, resource: str, *where: str) -> bool:
    """`kubectl auth can-i` as `system:serviceaccount:NS:NAME` (`account` = NS:NAME);
    `resource` is `RESOURCE[/NAME]`, with `#SUBRESOURCE` after it for a subresource."""
    resource, _, subresource = resource.partition("#")
    extra = [f"--subresource={subresource}"] if subresource else []
    result = kube.run("auth", "can-i", verb, resource, *where, *extra,
                      f"--as=system:serviceaccount:{account}")  # fmt: skip
    answer = result.stdout.strip()
    assert answer in ("yes", "no"), f"kubectl auth can-i: {result.stderr}"
    return answer == "yes"


def objects(kube: Kube, kinds: Sequence[str], *where: str) -> dict[tuple[str, str], Any]:
    """(kind, name) -> the object, for every object of `kinds` found with `where`."""
    listing = kube.get(",".join(kinds), *where)
    return {(item["kind"], item["metadata"]["name"]): item for item in listing["items"]}
