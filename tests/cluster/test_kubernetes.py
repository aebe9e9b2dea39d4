"""The local cluster behaves like a real Kubernetes cluster with GPU nodes (issue 2)."""

from __future__ import annotations

import ipaddress
import json
from typing import Any

import pytest
import yaml
from kubernetes import client, watch

from llmfleet.core.cluster.nodes import GPU_PRODUCT_LABEL, GPU_RESOURCE
from tests.cluster.kube import Kube

pytestmark = pytest.mark.cluster


def gpu_deployment(name: str, replicas: int, gpus: int) -> str:
    manifest: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    # The session's H100 nodes only (other tests may add other GPU types).
                    "nodeSelector": {GPU_PRODUCT_LABEL: "NVIDIA-H100-80GB-HBM3"},
                    # No toleration here on purpose: ExtendedResourceToleration adds the one for
                    # the GPU taint, as on managed GPU node pools.
                    "tolerations": [
                        {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}
                    ],
                    "containers": [
                        {
                            "name": "engine",
                            "image": "vllm/vllm-openai:fake",
                            "resources": {
                                "requests": {GPU_RESOURCE: str(gpus)},
                                "limits": {GPU_RESOURCE: str(gpus)},
                            },
                        }
                    ],
                },
            },
        },
    }
    return yaml.safe_dump(manifest)


def pods(kube: Kube, namespace: str, app: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kube.get("pods", "-n", namespace, "-l", f"app={app}")["items"]
    return items


def is_ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def test_nodes_advertise_gpus_with_gpu_labels(kube: Kube) -> None:
    # The session's nodes (other tests add nodes of other GPU types).
    items = [
        node for node in kube.get("nodes", "-l", "nvidia.com/gpu.present=true")["items"]
        if node["metadata"]["name"].startswith("gpu-h100-")
    ]  # fmt: skip
    assert len(items) >= 2
    for node in items:
        assert node["status"]["capacity"][GPU_RESOURCE] == "8"
        assert node["status"]["allocatable"][GPU_RESOURCE] == "8"
        assert node["metadata"]["labels"][GPU_PRODUCT_LABEL] == "NVIDIA-H100-80GB-HBM3"
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert [c["status"] for c in ready] == ["True"]


def test_gpu_pods_are_scheduled_and_become_ready(kube: Kube, namespace: str) -> None:
    kube.kubectl("apply", "-n", namespace, "-f", "-", stdin=gpu_deployment("fits", 2, 4))

    def two_ready() -> list[dict[str, Any]] | None:
        ready = [pod for pod in pods(kube, namespace, "fits") if is_ready(pod)]
        return ready if len(ready) == 2 else None

    ready = kube.wait_for(two_ready, 60, "2 Ready GPU pods")
    for pod in ready:
        assert pod["spec"]["nodeName"].startswith("gpu-h100-")
        # kwok gives fake pod IPs; nothing may be sent to them (they are not on loopback, and
        # EndpointSlices refuse loopback addresses), but they must be real addresses.
        assert not ipaddress.ip_address(pod["status"]["podIP"]).is_loopback
        tolerations = {t.get("key") for t in pod["spec"].get("tolerations", [])}
        assert GPU_RESOURCE in tolerations, "ExtendedResourceToleration did not add the toleration"


def test_pods_beyond_gpu_capacity_stay_pending(kube: Kube, namespace: str) -> None:
    # 2 nodes x 8 GPUs; 3 pods of 8 GPUs: exactly one cannot fit anywhere, whatever else runs.
    kube.kubectl("apply", "-n", namespace, "-f", "-", stdin=gpu_deployment("too-big", 3, 8))

    def pending_with_event() -> str | None:
        pending = [p for p in pods(kube, namespace, "too-big") if p["status"]["phase"] == "Pending"]
        if not pending:
            return None
        events = kube.get(
            "events", "-n", namespace,
            "--field-selector", f"involvedObject.name={pending[0]['metadata']['name']}",
        )["items"]  # fmt: skip
        failed = [e for e in events if e["reason"] == "FailedScheduling"]
        return str(failed[0]["message"]) if failed else None

    message = kube.wait_for(pending_with_event, 60, "a FailedScheduling event")
    assert "nvidia.com/gpu" in message
    # Still pending a moment later: the scheduler does not place it anywhere.
    running = [p for p in pods(kube, namespace, "too-big") if p["status"]["phase"] == "Running"]
    assert len(running) <= 2


def test_deleting_a_deployment_collects_its_replicaset_and_pods(kube: Kube, namespace: str) -> None:
    kube.kubectl("apply", "-n", namespace, "-f", "-", stdin=gpu_deployment("gc", 1, 1))
    kube.wait_for(lambda: any(is_ready(p) for p in pods(kube, namespace, "gc")), 60, "a Ready pod")
    assert kube.get("replicasets", "-n", namespace, "-l", "app=gc")["items"]
    kube.kubectl("delete", "deployment", "gc", "-n", namespace, "--wait=false")
    kube.wait_for(
        lambda: not kube.get("replicasets", "-n", namespace, "-l", "app=gc")["items"]
        and not pods(kube, namespace, "gc"),
        60, "the garbage collector to remove the ReplicaSet and pods",
    )  # fmt: skip


def test_server_side_apply_tracks_field_managers_and_conflicts(kube: Kube, namespace: str) -> None:
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "owned", "namespace": namespace},
        "data": {"mode": "unified"},
    }
    kube.kubectl("apply", "--server-side", "--field-manager=llmfleet-operator", "-f", "-",
                 stdin=json.dumps(config_map))  # fmt: skip
    managed = kube.get("configmap", "owned", "-n", namespace, "--show-managed-fields")
    managers = {entry["manager"] for entry in managed["metadata"]["managedFields"]}
    assert "llmfleet-operator" in managers

    config_map["data"] = {"mode": "disaggregated"}
    conflict = kube.run("apply", "--server-side", "--field-manager=someone-else", "-f", "-",
                        stdin=json.dumps(config_map))  # fmt: skip
    assert conflict.returncode != 0
    assert "conflict" in conflict.stderr.lower()
    assert kube.get("configmap", "owned", "-n", namespace)["data"]["mode"] == "unified"


CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.test.llmfleet.dev"},
    "spec": {
        "group": "test.llmfleet.dev",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "properties": {"size": {"type": "integer", "minimum": 1}},
                            },
                            "status": {
                                "type": "object",
                                "properties": {"phase": {"type": "string"}},
                            },
                        },
                    }
                },
            }
        ],
    },
}


def test_custom_resources_with_status_subresource_can_be_watched(
    kube: Kube, namespace: str
) -> None:
    kube.kubectl("apply", "--server-side", "-f", "-", stdin=json.dumps(CRD))
    kube.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                 "crd/widgets.test.llmfleet.dev")  # fmt: skip
    api = client.CustomObjectsApi(kube.api())
    group = ("test.llmfleet.dev", "v1", namespace, "widgets")
    start = api.list_namespaced_custom_object(*group)["metadata"]["resourceVersion"]
    widget = {"apiVersion": "test.llmfleet.dev/v1", "kind": "Widget",
              "metadata": {"name": "w1"}, "spec": {"size": 3}}  # fmt: skip
    api.create_namespaced_custom_object(*group, widget)
    # Status goes through the status subresource.
    api.patch_namespaced_custom_object_status(*group, "w1", {"status": {"phase": "Ready"}})

    # A watch from the resourceVersion before the create replays both changes in order.
    seen: list[tuple[str, str | None]] = []
    watcher = watch.Watch()
    for event in watcher.stream(
        api.list_namespaced_custom_object, *group, resource_version=start, timeout_seconds=20
    ):
        seen.append((event["type"], event["object"].get("status", {}).get("phase")))
        if len(seen) == 2:
            watcher.stop()
    assert seen == [("ADDED", None), ("MODIFIED", "Ready")]

    rejected = kube.run("apply", "-n", namespace, "-f", "-", stdin=json.dumps(
        {**widget, "metadata": {"name": "w2"}, "spec": {"size": 0}}))  # fmt: skip
    assert rejected.returncode != 0
    assert "spec.size" in rejected.stderr
