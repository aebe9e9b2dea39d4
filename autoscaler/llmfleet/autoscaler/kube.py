"""The autoscaler's Kubernetes I/O: list services and their pods, write `status.autoscaling`.

It only ever writes the status subresource's `autoscaling` key (a JSON merge patch, so the
operator's keys are untouched) and Events; never `spec`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from llmfleet.autoscaler.pods import PodView
from llmfleet.crds import labels as L
from llmfleet.crds.inference_service import GROUP, PLURAL, VERSION

MERGE_PATCH = "application/merge-patch+json"


def pod_view(pod: client.V1Pod) -> PodView:
    meta: Any = pod.metadata
    labels = meta.labels or {}
    conditions = {c.type: c for c in (pod.status.conditions or [])} if pod.status else {}
    ready = conditions.get("Ready")
    scheduled = conditions.get("PodScheduled")
    return PodView(
        pool=labels.get(L.POOL, ""),
        ready=ready is not None and ready.status == "True",
        serving=labels.get(L.SERVING) == "true",
        terminating=meta.deletion_timestamp is not None,
        unschedulable=scheduled is not None
        and scheduled.status == "False"
        and scheduled.reason == "Unschedulable",
    )


class Kube:
    def __init__(self, api: client.ApiClient, namespaces: list[str], field_manager: str) -> None:
        self.api = api
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.namespaces = namespaces
        self.field_manager = field_manager

    def list_services(self) -> list[dict[str, Any]]:
        if not self.namespaces:
            body: Any = self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
            return list(body["items"])
        items: list[dict[str, Any]] = []
        for namespace in self.namespaces:
            listed: Any = self.custom.list_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL
            )
            items += listed["items"]
        return items

    def list_pods(self) -> dict[tuple[str, str], list[PodView]]:
        """Engine pods of every service, keyed by (namespace, service name)."""
        if self.namespaces:
            pods = [
                pod
                for namespace in self.namespaces
                for pod in self.core.list_namespaced_pod(namespace, label_selector=L.SERVICE).items
            ]
        else:
            pods = self.core.list_pod_for_all_namespaces(label_selector=L.SERVICE).items
        result: dict[tuple[str, str], list[PodView]] = defaultdict(list)
        for pod in pods:
            meta: Any = pod.metadata
            result[(meta.namespace, meta.labels[L.SERVICE])].append(pod_view(pod))
        return result

    def write_autoscaling(self, namespace: str, name: str, autoscaling: Mapping[str, Any]) -> bool:
        """Merge-patch `status.autoscaling`; False when the service is gone."""
        try:
            self.custom.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                {"status": {"autoscaling": dict(autoscaling)}},
                field_manager=self.field_manager,
                _content_type=MERGE_PATCH,
            )
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return True

    def event(self, service: Mapping[str, Any], reason: str, message: str) -> None:
        metadata = service["metadata"]
        now = datetime.now(UTC)
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{metadata['name']}."),
            involved_object=client.V1ObjectReference(
                api_version=service.get("apiVersion"),
                kind=service.get("kind"),
                name=metadata["name"],
                namespace=metadata["namespace"],
                uid=metadata.get("uid"),
            ),
            reason=reason,
            message=message[:1024],
            type="Normal",
            source=client.V1EventSource(component=self.field_manager),
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        self.core.create_namespaced_event(metadata["namespace"], event)
