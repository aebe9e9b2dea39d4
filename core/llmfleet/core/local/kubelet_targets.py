"""Prometheus targets of the pods the real node's kubelet runs (pure: pods in, groups out).

The system's Prometheus is Debian's build, which leaves out Kubernetes service discovery, so
the pod runner, which lists the pods anyway, writes these file-discovery groups beside the ones
of the engines it runs itself: engine pods on the real node (job `engines`, labelled as the
ServiceMonitor labels them) and the chart's component pods (job `llmfleet`, one target per
container port named `metrics` or `admin`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any

from llmfleet.core.cluster.realnode_config import POD_SUBNET

ENGINE_PORT = 8000
COMPONENT_LABEL = "app.kubernetes.io/component"
METRICS_PORT_NAMES = ("metrics", "admin")


def on_real_node(pod: Any) -> bool:
    """A running pod with an address on the real node's bridge (the kubelet runs it)."""
    status = pod.status
    if pod.metadata.deletion_timestamp is not None or status is None or status.phase != "Running":
        return False
    try:
        return ipaddress.ip_address(status.pod_ip or "") in ipaddress.ip_network(POD_SUBNET)
    except ValueError:
        return False


def engine_groups(pods: Iterable[Any], labels_of: Any) -> list[dict[str, Any]]:
    """One group per engine pod on the real node; `labels_of(pod)` gives its target labels."""
    return [
        {"targets": [f"{pod.status.pod_ip}:{ENGINE_PORT}"], "labels": labels_of(pod)}
        for pod in sorted(pods, key=_key)
        if on_real_node(pod)
    ]


def component_groups(pods: Iterable[Any]) -> list[dict[str, Any]]:
    """One group per metrics port of each component pod on the real node."""
    groups = []
    for pod in sorted(pods, key=_key):
        if not on_real_node(pod):
            continue
        component = (pod.metadata.labels or {}).get(COMPONENT_LABEL, "")
        for container in pod.spec.containers:
            for port in container.ports or []:
                if port.name in METRICS_PORT_NAMES:
                    groups.append(
                        {
                            "targets": [f"{pod.status.pod_ip}:{port.container_port}"],
                            "labels": {"component": component, "pod": pod.metadata.name},
                        }
                    )
    return groups


def _key(pod: Any) -> tuple[str, str]:
    return pod.metadata.namespace or "", pod.metadata.name or ""
