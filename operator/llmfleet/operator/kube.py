"""The operator's only door to the Kubernetes API: read the world, write with server-side apply.

Pods, children and the service itself are read from memory kept by watches (`watched.py`); the
ServiceMonitor CRD (once a minute), and, only while they explain something, nodes and
EndpointSlices are read from the API server.

Every write goes through one field manager. Conflicts with other managers are forced (we own
what we write: drift is reverted). No call sleeps to retry: a transient answer (a conflict,
throttling, unavailability) raises `Transient`, which ends the pass, and the service's loop
requeues it after the server's Retry-After or its back-off (`handlers.py`), holding no thread.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Callable, Collection, Mapping
from datetime import UTC, datetime
from functools import partial
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from llmfleet.crds import GROUP, PLURAL, VERSION, Condition
from llmfleet.crds import labels as L
from llmfleet.crds.gpus import GPU_PRODUCT_LABEL
from llmfleet.crds.inference_service import AutoscalingStatus
from llmfleet.operator.answers import RETRYABLE_DELETE, RETRYABLE_WRITE, asked
from llmfleet.operator.drift import stamped
from llmfleet.operator.inflight import probe_in_flight
from llmfleet.operator.observed import Observed, ObservedChild, observed_pod, rollout_status
from llmfleet.operator.pools import PodChange
from llmfleet.operator.watched import POD, SERVICE, Watched

SERVICE_MONITOR_CRD = "servicemonitors.monitoring.coreos.com"

CHILD_KINDS = (
    ("v1", "ConfigMap"),
    ("v1", "Service"),
    ("apps/v1", "Deployment"),
    ("policy/v1", "PodDisruptionBudget"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
)
"""The kinds of a service's children (with `MONITOR_KIND` where its CRD exists)."""
MONITOR_KIND = ("monitoring.coreos.com/v1", "ServiceMonitor")

PLURALS = {
    "ConfigMap": "configmaps",
    "Service": "services",
    "Pod": "pods",
    "Deployment": "deployments",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "ServiceMonitor": "servicemonitors",
    "NetworkPolicy": "networkpolicies",
}
"""The kinds the operator writes. A fixed table: API discovery costs seconds on every start."""


_ESCAPED_IN_YAML = re.compile("[\x7f-\uffff]")


def apply_body(manifest: Mapping[str, Any]) -> bytes:
    """`manifest` as the body of an `application/apply-patch+yaml` request: JSON (which is
    YAML) that the API server's YAML decoder reads back to exactly the same text.

    NOTE: neither plain way of writing JSON does that for every string:
    1. `ensure_ascii` writes a character outside the Basic Multilingual Plane (an emoji, a
       mathematical letter) as a surrogate pair of `\\u` escapes; JSON allows that, YAML does
       not, and the decoder refuses the body ("found invalid Unicode character escape code").
    2. Raw UTF-8 everywhere fails the other way: YAML refuses DEL, the C1 controls, U+FFFE and
       U+FFFF written as themselves, and reads U+0085, U+2028 and U+2029 as line breaks (folded
       to a space inside a quoted string).
    So characters beyond the BMP go as UTF-8 and every other non-ASCII or DEL character as a
    `\\uXXXX` escape, which YAML and JSON read alike. (Controls below U+0020 are escaped by
    `json.dumps` itself.) `application/apply-patch+cbor` would avoid text altogether, but
    kube-apiserver v1.36 serves it only behind the alpha feature gate CBORServingAndStorage.
    """
    text = json.dumps(manifest, ensure_ascii=False, separators=(",", ":"))
    return _ESCAPED_IN_YAML.sub(lambda char: f"\\u{ord(char[0]):04x}", text).encode()


def _object_path(api_version: str, kind: str, namespace: str | None) -> str:
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    scope = f"/namespaces/{namespace}" if namespace else ""
    return f"{prefix}{scope}/{PLURALS[kind]}"


class Kube:
    def __init__(
        self,
        api: client.ApiClient,
        field_manager: str,
        watched: Watched,
        in_flight: Callable[[str, int], int | None] = probe_in_flight,
        sync_timeout: float = 30.0,
    ) -> None:
        self.watched = watched
        """Pods and children, kept by watches: what `observe` reads."""
        self.sync_timeout = sync_timeout
        self.in_flight = in_flight
        self.api = api
        self.field_manager = field_manager
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.extensions = client.ApiextensionsV1Api(api)
        self._monitor_crd: tuple[float, bool] | None = None

    # -- reading ---------------------------------------------------------------------------

    def service_monitor_crd(self) -> bool:
        """Whether the Prometheus Operator's CRD exists (checked at most once a minute)."""
        now = time.monotonic()
        if self._monitor_crd is None or now - self._monitor_crd[0] > 60:
            try:
                self.extensions.read_custom_resource_definition(SERVICE_MONITOR_CRD)
                found = True
            except ApiException as error:
                if error.status != 404:
                    raise
                found = False
            self._monitor_crd = (now, found)
        return self._monitor_crd[1]

    def gpu_node_products(self) -> tuple[str, ...] | None:
        """`nvidia.com/gpu.product` of each node that has the label; None when the operator may
        not list nodes (a namespaced install): the conditions then say only what the scheduler
        says."""
        try:
            listing = asked(lambda: self.core.list_node(label_selector=GPU_PRODUCT_LABEL))
        except ApiException as error:
            if error.status != 403:
                raise
            return None
        metadata: list[Any] = [node.metadata for node in listing.items]
        return tuple(sorted(meta.labels[GPU_PRODUCT_LABEL] for meta in metadata))

    def get_service(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The InferenceService as the watch brought it (or as this operator's last status
        write returned it, `informer.newest`), else as stored now (a GET: a service the watch
        has not brought yet, or one just deleted), None when it does not exist."""
        self.watched.wait_synced([], self.sync_timeout)
        cached = self.watched.service(namespace, name)
        if cached is not None:
            return dict(cached)
        return self.get_stored_service(namespace, name)

    def still_stored(self, namespace: str, name: str, uid: str) -> bool:
        """Whether the InferenceService `uid` is stored now and not being deleted: a GET, not
        the watch. The pass asks before it creates a child: the watches of services and of
        children are separate streams, so the collector's deletion of a deleted service's
        Deployment can arrive before the service's own deletion, and a pass would create the
        Deployment again (pods started, then collected) for a service that is gone."""
        body = self.get_stored_service(namespace, name)
        if body is None:
            return False
        metadata = body.get("metadata") or {}
        return metadata.get("uid") == uid and not metadata.get("deletionTimestamp")

    def get_stored_service(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The InferenceService as stored now (a GET), None when it does not exist."""
        try:
            return cast(
                dict[str, Any],
                asked(
                    lambda: self.custom.get_namespaced_custom_object(
                        GROUP, VERSION, namespace, PLURAL, name
                    )
                ),
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def observe(
        self,
        namespace: str,
        name: str,
        status: Mapping[str, Any],
        pools: Collection[str],
        model: str,
    ) -> Observed:
        """Everything the plan needs about the service `name` whose spec has `pools` and
        serves `model`: its pods, children and the services claiming its model name from
        memory (`watched`), once the watches have their first LIST."""
        monitors = self.service_monitor_crd()
        kinds = [*CHILD_KINDS, MONITOR_KIND] if monitors else list(CHILD_KINDS)
        self.watched.wait_synced(kinds, self.sync_timeout)
        pods = self.watched.of(POD, namespace, name)
        autoscaling = status.get("autoscaling")
        observed = [observed_pod(pod) for pod in pods]
        for index, (raw, pod) in enumerate(zip(pods, observed, strict=True)):
            ip = (raw.get("status") or {}).get("podIP")
            if pod.demoted_at is not None and not pod.serving and ip:
                # Only draining pods are asked; the plan deletes them once nothing is in flight.
                observed[index] = dataclasses.replace(
                    pod, in_flight=self.in_flight(ip, L.ENGINE_PORT)
                )
        # Nodes are listed only while a pod is unschedulable: the one case their GPU products
        # explain (no node of the service's GPU type), and no cost in steady state.
        unschedulable = any(pod.unschedulable and not pod.terminating for pod in observed)
        children = self.children(namespace, name, kinds)
        retiring = any(child.pool and child.pool not in pools for child in children)
        return Observed(
            pods=tuple(observed),
            children=children,
            ready_endpoints=self.ready_endpoints(namespace, name) if retiring else None,
            model_claims=self.watched.claims(model),
            gpu_node_products=self.gpu_node_products() if unschedulable else None,
            service_monitor_crd=monitors,
            conditions=tuple(
                Condition.model_validate(condition) for condition in status.get("conditions", [])
            ),
            autoscaling=AutoscalingStatus.model_validate(autoscaling) if autoscaling else None,
            **rollout_status(status),
        )

    def children(
        self, namespace: str, name: str, kinds: Collection[tuple[str, str]]
    ) -> tuple[ObservedChild, ...]:
        """Every object of `kinds` in the namespace labelled `llmfleet.dev/service: name`, with
        its labels and controller owner, for the plan to decide what is really ours."""
        found: list[ObservedChild] = []
        for api_version, kind in kinds:
            items = self.watched.of((api_version, kind), namespace, name)
            for item in sorted(items, key=lambda item: str(item["metadata"]["name"])):
                meta = item["metadata"]
                owners = meta.get("ownerReferences") or []
                found.append(
                    ObservedChild(
                        api_version=api_version, kind=kind, namespace=namespace,
                        name=meta["name"], uid=meta["uid"], labels=meta.get("labels") or {},
                        controller_uid=next(
                            (ref.get("uid") for ref in owners if ref.get("controller")), None
                        ),
                        data=(item.get("data") or {}) if kind == "ConfigMap" else {},
                        body=item,
                    )
                )  # fmt: skip
        return tuple(found)

    def ready_endpoints(self, namespace: str, name: str) -> dict[str, int]:
        """Pool -> ready endpoints in its Service's EndpointSlices (which carry the Service's
        labels, so one list finds every pool's)."""
        path = f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"
        query = [("labelSelector", f"{L.SERVICE}={name},{L.POOL}")]
        listing = asked(partial(self._call, "GET", path, query))
        counts: dict[str, int] = {}
        for item in listing.get("items") or []:
            pool = item["metadata"]["labels"][L.POOL]
            ready = [e for e in item.get("endpoints") or [] if e.get("conditions", {}).get("ready")]
            counts[pool] = counts.get(pool, 0) + len(ready)
        return counts

    def _call(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]],
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        """One request by path (kinds need no typed client); the answer's JSON object. Raises
        ApiException for anything but 2xx."""
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        request = self.api.param_serialize(
            method, path, query_params=query, header_params=headers, body=body,
            auth_settings=["BearerToken"],
        )  # fmt: skip
        response = self.api.call_api(*request)
        response.read()  # type: ignore[no-untyped-call]
        answer = self.api.response_deserialize(response, {"2XX": "object"})
        return cast(dict[str, Any], answer.data or {})

    # -- writing ---------------------------------------------------------------------------

    def apply_child(self, service: str, manifest: Mapping[str, Any]) -> None:
        """Apply a child of `service`, stamped with its manifest's digest (`drift.APPLIED`):
        the pass calls this only for a child that `drift.drifted` says must be written."""
        self.apply(stamped(manifest))

    def apply(self, manifest: Mapping[str, Any]) -> None:
        """Server-side apply one object (forcing conflicts: what we manage, we own).

        Raises ApiException when the API server refuses it, `Transient` when it is throttled
        or unavailable."""
        metadata = manifest["metadata"]
        path = _object_path(manifest["apiVersion"], manifest["kind"], metadata.get("namespace"))
        query = [("fieldManager", self.field_manager), ("force", "true")]
        body = apply_body(manifest)
        applied = asked(
            lambda: self._call("PATCH", f"{path}/{metadata['name']}", query, body,
                               "application/apply-patch+yaml"),
            retryable=RETRYABLE_WRITE,
        )  # fmt: skip
        # The next pass reads the object as applied until the watch brings it: it does not
        # apply a child again because the watch has not shown it yet.
        self.watched.wrote((manifest["apiVersion"], manifest["kind"]), applied)

    def delete_child(self, child: ObservedChild) -> None:
        """Delete a child that is no longer wanted, its dependents (a Deployment's pods) after
        it in the background. Only that very object: a new one of the same name (another uid)
        is left alone, and one already gone is fine."""
        path = f"{_object_path(child.api_version, child.kind, child.namespace)}/{child.name}"
        options = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background",
                   "preconditions": {"uid": child.uid}}  # fmt: skip
        try:
            asked(lambda: self._call("DELETE", path, [], options), retryable=RETRYABLE_DELETE)
        except ApiException as error:
            if error.status not in (404, 409):
                raise

    def change_pod(self, namespace: str, change: PodChange) -> None:
        """Apply the serving label and our annotations to one pod (absent ones are removed)."""
        annotations = {L.DELETION_COST: str(change.deletion_cost)}
        if change.demoted_at is not None:
            annotations[L.DEMOTED_AT] = change.demoted_at.strftime("%Y-%m-%dT%H:%M:%SZ")
        manifest = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": change.name,
                "namespace": namespace,
                "labels": {L.SERVING: change.serving_value if change.serving else "false"},
                "annotations": annotations,
            },
        }
        try:
            self.apply(manifest)
        except ApiException as error:
            if error.status != 404:  # the pod went away meanwhile: the next pass sees that
                raise

    def write_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        """Merge-patch the status subresource; keys we do not send (autoscaling) are kept."""
        try:
            written = asked(
                lambda: self.custom.patch_namespaced_custom_object_status(
                    GROUP, VERSION, namespace, PLURAL, name, {"status": dict(status)}
                )
            )
        except ApiException as error:
            if error.status != 404:  # 404: the service was deleted meanwhile; nothing to report
                raise
            return
        if isinstance(written, Mapping):  # the next pass reads this until the watch has it
            self.watched.wrote(SERVICE, written)

    def event(
        self, owner: Mapping[str, Any], reason: str, message: str, warning: bool = False
    ) -> None:
        metadata = owner["metadata"]
        now = datetime.now(UTC)
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{metadata['name']}."),
            involved_object=client.V1ObjectReference(
                api_version=owner.get("apiVersion"),
                kind=owner.get("kind"),
                name=metadata["name"],
                namespace=metadata["namespace"],
                uid=metadata.get("uid"),
            ),
            reason=reason,
            message=message[:1024],
            type="Warning" if warning else "Normal",
            source=client.V1EventSource(component=self.field_manager),
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        asked(lambda: self.core.create_namespaced_event(metadata["namespace"], event))
