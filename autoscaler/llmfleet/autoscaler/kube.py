"""The autoscaler's Kubernetes I/O: list services, keep their pods, write `status.autoscaling`.

Engine pods come from a watch (`llmfleet.core.informer`: a LIST with the server-side selector
`llmfleet.dev/service`, then a WATCH resumed from its resourceVersion): a pass reads them from
memory, with no request.

It only ever writes the status subresource's `autoscaling` key (a JSON merge patch, so the
operator's keys are untouched) and Events; never `spec`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from llmfleet.autoscaler.pods import PodView
from llmfleet.core.informer import Informer, client_informer
from llmfleet.crds import labels as L
from llmfleet.crds.inference_service import GROUP, PLURAL, VERSION

MERGE_PATCH = "application/merge-patch+json"


def pod_view(pod: Mapping[str, Any]) -> PodView:
    """A pod as the API server sends it (JSON), as the policy counts it."""
    meta, status = pod["metadata"], pod.get("status") or {}
    labels = meta.get("labels") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    ready = conditions.get("Ready") or {}
    scheduled = conditions.get("PodScheduled") or {}
    return PodView(
        pool=labels.get(L.POOL, ""),
        ready=ready.get("status") == "True",
        serving=labels.get(L.SERVING) == "true",
        terminating=meta.get("deletionTimestamp") is not None,
        unschedulable=scheduled.get("status") == "False"
        and scheduled.get("reason") == "Unschedulable",
    )


def service_of(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(namespace, the pod's `llmfleet.dev/service` label): the service it belongs to."""
    meta = pod["metadata"]
    service = (meta.get("labels") or {}).get(L.SERVICE)
    return (meta.get("namespace") or "", service) if service else None


class Kube:
    def __init__(
        self,
        api: client.ApiClient,
        namespaces: list[str],
        field_manager: str,
        sync_timeout: float = 30.0,
    ) -> None:
        self.api = api
        self.sync_timeout = sync_timeout
        self._pods: list[Informer] | None = None
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

    def pod_informers(self) -> list[Informer]:
        """The engine pods' informers (one per namespace, or one for the cluster), started on
        first use."""
        if self._pods is None:
            selector = L.SERVICE
            calls = (
                [functools.partial(self.core.list_namespaced_pod, namespace,
                                   label_selector=selector) for namespace in self.namespaces]
                if self.namespaces
                else [functools.partial(self.core.list_pod_for_all_namespaces,
                                        label_selector=selector)]
            )  # fmt: skip
            self._pods = [client_informer("pods", self.api, c) for c in calls]
            for informer in self._pods:
                informer.start()
        return self._pods

    def list_pods(self) -> dict[tuple[str, str], list[PodView]]:
        """Engine pods of every service, keyed by (namespace, service name), from memory; the
        first call waits up to `sync_timeout` for the first LIST (TimeoutError after)."""
        result: dict[tuple[str, str], list[PodView]] = {}
        for informer in self.pod_informers():
            if not informer.wait_synced(self.sync_timeout):
                raise TimeoutError(f"no first LIST of pods in {self.sync_timeout:.0f}s")
            for pod in informer.items():
                key = service_of(pod)
                if key is not None:
                    result.setdefault(key, []).append(pod_view(pod))
        return result

    def stop(self) -> None:
        """End the pods' watches (at their next event or the server's timeout)."""
        for informer in self._pods or []:
            informer.stop()

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
