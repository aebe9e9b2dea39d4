"""The autoscaler's Kubernetes I/O: keep the services and their pods, write `status.autoscaling`.

InferenceServices and engine pods come from watches (`llmfleet.core.informer`: a LIST, the pods'
with the server-side selector `llmfleet.dev/service`, then a WATCH resumed from its
resourceVersion), one per namespace or one for the cluster: a pass reads them from memory, with
no request. Of a pod the cache keeps only what `service_of` and `pod_view` read (`kept.py`, the
pod informers' transform). A service reads as this autoscaler's own last status write returned
it while the watch has not brought that write yet (`newest`), so the pass after a write neither
writes it again nor reports its change twice.

It only ever writes the status subresource's `autoscaling` key (a JSON merge patch, so the
operator's keys are untouched) and Events; never `spec`.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from llmfleet.autoscaler import kept
from llmfleet.autoscaler.pods import PodView
from llmfleet.core.informer import Informer, Key, Transform, client_informer, key_of, newest
from llmfleet.crds import labels as L
from llmfleet.crds.inference_service import GROUP, PLURAL, VERSION

MERGE_PATCH = "application/merge-patch+json"
InformerFactory = Callable[..., Informer]
"""Makes an informer (not started): `(what, call, transform=...)`, `call` a bound list method of
the Kubernetes client, `transform` what the informer keeps of each object (None: all of it)
(`client_informer`; a test may hold back its watch's events)."""


def pod_view(pod: Mapping[str, Any]) -> PodView:
    """A pod as the API server sends it (JSON) or as `kept.pod` keeps it, as the policy counts
    it: a field read here must be kept there."""
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
    """(namespace, the pod's `llmfleet.dev/service` label): the service it belongs to (read of
    a kept pod too, as `pod_view`)."""
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
        informer: InformerFactory | None = None,
    ) -> None:
        self.api = api
        self._informer = informer or (
            lambda what, call, transform=None: client_informer(what, api, call, transform=transform)
        )
        self.sync_timeout = sync_timeout
        self._pods: list[Informer] | None = None
        self._services: list[Informer] | None = None
        self._lock = threading.Lock()
        self._written: dict[Key, Mapping[str, Any]] = {}
        """Services as this autoscaler's status writes returned them, until the watch brings
        that version or a newer one, or loses the service."""
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.namespaces = namespaces
        self.field_manager = field_manager

    def _started(
        self, what: str, calls: Sequence[Callable[..., Any]], transform: Transform | None = None
    ) -> list[Informer]:
        informers = [self._informer(what, call, transform=transform) for call in calls]
        for informer in informers:
            informer.start()
        return informers

    def _synced(self, informers: list[Informer]) -> list[Mapping[str, Any]]:
        """Every object the informers hold; waits up to `sync_timeout` in all for their first
        LISTs (TimeoutError after)."""
        deadline = time.monotonic() + self.sync_timeout
        found: list[Mapping[str, Any]] = []
        for informer in informers:
            if not informer.wait_synced(max(deadline - time.monotonic(), 0.0)):
                raise TimeoutError(f"no first LIST of {informer.what} in {self.sync_timeout:.0f}s")
            found += informer.items()
        return found

    def service_informers(self) -> list[Informer]:
        """The InferenceServices' informers (one per namespace, or one for the cluster),
        started on first use."""
        if self._services is None:
            calls = (
                [functools.partial(self.custom.list_namespaced_custom_object, GROUP, VERSION,
                                   namespace, PLURAL) for namespace in self.namespaces]
                if self.namespaces
                else [functools.partial(self.custom.list_cluster_custom_object, GROUP,
                                        VERSION, PLURAL)]
            )  # fmt: skip
            self._services = self._started(PLURAL, calls)
        return self._services

    def list_services(self) -> list[dict[str, Any]]:
        """Every InferenceService, from memory: as the watch brought it, or as this
        autoscaler's last status write returned it when that is newer (`newest`). The first
        call waits up to `sync_timeout` for the first LIST (TimeoutError after)."""
        found = {key_of(obj): obj for obj in self._synced(self.service_informers())}
        with self._lock:
            for key, written in list(self._written.items()):
                cached = found.get(key)
                if cached is not None and newest(cached, written) is written:
                    found[key] = written
                else:  # the watch has caught up, lost the service, or cannot be compared
                    del self._written[key]
        return [dict(obj) for obj in found.values()]

    def pod_informers(self) -> list[Informer]:
        """The engine pods' informers (one per namespace, or one for the cluster), keeping what
        `kept.pod` keeps of each pod, started on first use."""
        if self._pods is None:
            selector = L.SERVICE
            calls = (
                [functools.partial(self.core.list_namespaced_pod, namespace,
                                   label_selector=selector) for namespace in self.namespaces]
                if self.namespaces
                else [functools.partial(self.core.list_pod_for_all_namespaces,
                                        label_selector=selector)]
            )  # fmt: skip
            self._pods = self._started("pods", calls, kept.pod)
        return self._pods

    def list_pods(self) -> dict[tuple[str, str], list[PodView]]:
        """Engine pods of every service, keyed by (namespace, service name), from memory; the
        first call waits up to `sync_timeout` for the first LIST (TimeoutError after)."""
        result: dict[tuple[str, str], list[PodView]] = {}
        for pod in self._synced(self.pod_informers()):
            key = service_of(pod)
            if key is not None:
                result.setdefault(key, []).append(pod_view(pod))
        return result

    def start(self) -> None:
        """Start the services' and the pods' watches now, together: started on first use, by
        a pass, the pods' LIST would begin only once the services' was in."""
        self.service_informers()
        self.pod_informers()

    def synced_at(self) -> float | None:
        """When the last of the watches' first LISTs was in memory (`time.monotonic()`); None
        until all of them are, or before they are started."""
        informers = [*(self._services or []), *(self._pods or [])]
        times = [informer.synced_at for informer in informers]
        if not informers or None in times:
            return None
        return max(t for t in times if t is not None)

    def stop(self) -> None:
        """End the services' and pods' watches."""
        for informer in [*(self._services or []), *(self._pods or [])]:
            informer.stop()

    def write_autoscaling(self, namespace: str, name: str, autoscaling: Mapping[str, Any]) -> bool:
        """Merge-patch `status.autoscaling`; False when the service is gone."""
        try:
            written: Any = self.custom.patch_namespaced_custom_object_status(
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
        if isinstance(written, Mapping) and isinstance(written.get("metadata"), Mapping):
            with self._lock:
                self._written[key_of(written)] = written
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
