"""llmfleet's Helm chart on the local system's real node (`llmfleet up --real-node`): its values
and its install, as a user installs it.

The operator, autoscaler and gateway are real pods of the control-plane image (`llmfleet images
build`), run by the kubelet with their ServiceAccounts' tokens, probes and security contexts; the
operator's engine pods get the local engine image (the launcher with llm-d-inference-sim). The
pods reach the system's Prometheus on the node's address, and the user's shell reaches the
gateway through its Service.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from llmfleet.core.cluster import LocalCluster, build, realnode
from llmfleet.core.cluster.errors import ClusterError
from llmfleet.core.local import layout

NOT_YET = (ClusterError, RuntimeError, subprocess.SubprocessError, OSError, KeyError, StopIteration)
"""What a check that cannot tell yet raises (chart.wait counts it as not yet)."""
GATEWAY_ADMIN_PORT = 8090
"""The gateway pod's admin port (/metrics, /readyz) on the real node, apart from the API's."""


def real_node_values(ports: layout.Ports, images: Mapping[str, str]) -> dict[str, object]:
    """Values for the chart on the real node. `images` maps `control-plane` and `engine-local`
    to the references imported into the node's containerd (never pulled: no registry here).

    The pods run in the system's network namespace, behind its bridge: nothing they send can
    leave it, so `loopbackOnly` stays off, as in a real cluster."""
    repository, tag = images["control-plane"].rsplit(":", 1)
    prometheus = f"http://{realnode.NODE_IP}:{ports.prometheus}"
    return {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "loopbackOnly": False,
        "operator": {
            "replicas": 1,
            "gatewayUrl": f"http://127.0.0.1:{ports.gateway}",
            "prometheusUrl": prometheus,
            "podDisruptionBudget": {"enabled": False},
            "settings": {
                "drainSeconds": 15,
                "resyncSeconds": 5,
                "runtimeImage": images["engine-local"],
            },
        },
        "autoscaler": {
            # One replica on a 2-core machine; it still takes its Lease as in production.
            "replicas": 1,
            "prometheusUrl": prometheus,
            "settings": {
                "intervalSeconds": 5,
                # As the supervised autoscaler (system.py): spares promoted within seconds.
                "fastIntervalSeconds": 1,
                "scrapeInterval": f"{layout.SCRAPE_SECONDS}s",
                "statusRefreshSeconds": 15,
            },
        },
        "gateway": {
            "replicas": 1,
            # The chart asks 500m for a production gateway; on 2 cores that would leave the
            # engine pods little room (its memory stays the chart's).
            "resources": {
                "requests": {"cpu": "100m", "memory": "512Mi"},
                "limits": {"memory": "1Gi"},
            },
            # A machine of one user: no API keys, said explicitly (the chart requires keys).
            "auth": "none",
            "podDisruptionBudget": {"enabled": False},
            "settings": {"adminPort": GATEWAY_ADMIN_PORT},
        },
    }


RESTRICTED_NAMESPACES = (layout.CHART_NAMESPACE, "default")
"""Namespaces that enforce Pod Security `restricted` on the real node's system."""


def namespace(name: str) -> dict[str, Any]:
    """A namespace that enforces Pod Security `restricted` (the API server's own admission)."""
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "labels": {
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest",
            },
        },
    }


def install(cluster: LocalCluster, values: dict[str, object], values_file: Path) -> None:
    """`helm install` of charts/llmfleet into `layout.CHART_NAMESPACE` with `values`."""
    values_file.write_text(yaml.safe_dump(values))
    helm = subprocess.run(
        [
            str(build.ensure_binary("helm")), "install", layout.CHART_RELEASE,
            str(layout.CHART), "--namespace", layout.CHART_NAMESPACE, "--create-namespace",
            "--values", str(values_file), "--kubeconfig", str(cluster.kubeconfig),
        ],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    if helm.returncode != 0:
        raise RuntimeError(f"helm install failed: {helm.stderr.strip()[-2000:]}")


def component_pods(cluster: LocalCluster) -> list[dict[str, Any]]:
    selector = "app.kubernetes.io/component in (operator,autoscaler,gateway)"
    listing = cluster.kubectl(
        "get", "pods", "-n", layout.CHART_NAMESPACE, "-o", "json", "-l", selector
    )
    items: list[dict[str, Any]] = json.loads(listing)["items"]
    return items


def components_ready(cluster: LocalCluster) -> bool:
    """Every component has a pod and each is Ready."""
    pods = component_pods(cluster)
    kinds = {pod["metadata"]["labels"].get("app.kubernetes.io/component") for pod in pods}
    return kinds >= {"operator", "autoscaler", "gateway"} and all(
        any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in pod.get("status", {}).get("conditions", [])
        )
        for pod in pods
    )  # fmt: skip


def gateway_address(cluster: LocalCluster) -> tuple[str, int]:
    """The gateway Service's ClusterIP and port (kube-proxy's rules reach a pod behind it)."""
    name = f"{layout.CHART_RELEASE}-gateway"
    service = json.loads(
        cluster.kubectl("get", "service", name, "-n", layout.CHART_NAMESPACE, "-o", "json")
    )
    port = next(p["port"] for p in service["spec"]["ports"] if p.get("name") == "http")
    return service["spec"]["clusterIP"], int(port)


def wait(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll `check` until it is true; a RuntimeError naming `what` at the deadline. A check
    that fails (the API server busy, a Service not there yet) counts as not yet."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except NOT_YET:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{what} after {timeout:.0f}s")
