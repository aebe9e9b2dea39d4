"""The operator's memory of every service's pods and children (issue 28): one informer per kind
(`llmfleet.core.informer`: a LIST, then a WATCH resumed from its resourceVersion), with the
server-side label selector `llmfleet.dev/service`, indexed by (namespace, that label). A pass
reads its service's objects from here, with no request, and a change to one of them wakes the
service's loop (`wake`), after the cache holds it.

The kinds are the children's (`kube.CHILD_KINDS`) and pods; ServiceMonitors are watched from
the first pass that finds their CRD installed. InferenceServices are watched too: a pass reads
its service from here (`service`: or the object its own last status write returned, while the
watch has not brought that write yet), and, indexed by the model name they serve, knows who
else claims its name (`claims`); a claimant that comes, goes or renames wakes the others. The
operator's namespaces are watched one by one (a Role is enough), all of them when it has none
or when one is a pattern.

Every informer keeps only what the operator reads of its objects (`kept.py`: of a pod, a few
fields; of a child or an InferenceService, all but `metadata.managedFields`), and so does the
copy of an object as the operator's own write returned it (`wrote`).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from kubernetes import client

from llmfleet.core.informer import (
    Index,
    Informer,
    OnChange,
    client_informer,
    key_of,
    newest,  # read-your-writes: what a pass reads of its service (tests import it here)
)
from llmfleet.crds import API_VERSION, KIND, PLURAL
from llmfleet.crds import labels as L
from llmfleet.crds.claims import claim_order, served_name
from llmfleet.operator.kept import transform

log = logging.getLogger("llmfleet.operator")

Kind = tuple[str, str]
"""(apiVersion, kind) of a watched kind."""
POD: Kind = ("v1", "Pod")
SERVICE: Kind = (API_VERSION, KIND)
"""InferenceServices, watched for the model names they claim."""
_CORE = {"Pod": "pod", "ConfigMap": "config_map", "Service": "service"}
"""The core kinds' names in `CoreV1Api`'s list methods (other groups go through
`CustomObjectsApi`, which takes any group's plural)."""
InformerFactory = Callable[..., Informer]
"""Makes an informer: `(what, call=..., index=..., on_change=..., transform=...)`, `call` a
bound list method of the Kubernetes client (`client_informer`; tests give informers over a fake
server)."""
Wake = Callable[[str, str], None]
"""Wakes the loop of the service (namespace, name) an object belongs to."""


def service_of(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """(namespace, `llmfleet.dev/service` label) of an object; None without the label."""
    meta = obj.get("metadata") or {}
    service = (meta.get("labels") or {}).get(L.SERVICE)
    return (meta.get("namespace") or "", service) if service else None


def _claim(obj: Mapping[str, Any] | None) -> tuple[str | None, bool]:
    """(the model name an InferenceService claims, whether it is being deleted)."""
    if obj is None:
        return (None, False)
    return (served_name(obj), "deletionTimestamp" in (obj.get("metadata") or {}))


class Watched:
    """Pods, children and InferenceServices, kept by watches; `start` before reading."""

    def __init__(
        self,
        api: client.ApiClient,
        namespaces: list[str],
        plurals: Mapping[str, str],
        wake: Wake | None = None,
        informer: InformerFactory | None = None,
    ) -> None:
        self.api = api
        self._informer = informer or functools.partial(client_informer, api=api)
        self._namespaces = [] if any(set("*?[") & set(ns) for ns in namespaces) else namespaces
        self._plurals = {**plurals, KIND: PLURAL}
        self._wake = wake
        self._informers: dict[Kind, list[Informer]] = {}
        self._lock = threading.Lock()
        self._written: dict[Kind, dict[tuple[str, str], Mapping[str, Any]]] = {}
        """Objects as this operator's writes returned them (applies, status writes), until the
        watch brings the same version or a newer one, or the object's deletion."""

    def set_wake(self, wake: Wake) -> None:
        """Who is woken by a change (the handlers' event loop, known once kopf has started)."""
        self._wake = wake

    def start(self, kinds: list[Kind]) -> None:
        """Watch `kinds` (and pods and InferenceServices); a kind already watched is left as
        it is."""
        for kind in [POD, SERVICE, *kinds]:
            self._ensure(kind)

    def stop(self) -> None:
        with self._lock:
            for informers in self._informers.values():
                for informer in informers:
                    informer.stop()

    def _ensure(self, kind: Kind) -> list[Informer]:
        with self._lock:
            found = self._informers.get(kind)
            if found is None:
                index: Index = served_name if kind == SERVICE else service_of
                changed: OnChange = (
                    self._service_changed if kind == SERVICE
                    else functools.partial(self._changed, kind)
                )  # fmt: skip
                found = [
                    self._informer(self._plurals[kind[1]], call=call, index=index,
                                   on_change=changed, transform=transform(kind[1]))
                    for call in self._calls(kind)
                ]  # fmt: skip
                for informer in found:
                    informer.start()
                self._informers[kind] = found
            return found

    def _calls(self, kind: Kind) -> list[Callable[..., Any]]:
        """The list calls of `kind` (one per namespace, or one for the cluster), with the
        service label as their server-side selector (InferenceServices: all of them)."""
        api_version, name = kind
        selector: str | None = None if kind == SERVICE else L.SERVICE
        if api_version == "v1":
            core = client.CoreV1Api(self.api)
            method = _CORE[name]
            if not self._namespaces:
                return [functools.partial(getattr(core, f"list_{method}_for_all_namespaces"),
                                          label_selector=selector)]  # fmt: skip
            return [
                functools.partial(
                    getattr(core, f"list_namespaced_{method}"), ns, label_selector=selector
                )
                for ns in self._namespaces
            ]
        group, version = api_version.split("/")
        custom = client.CustomObjectsApi(self.api)
        plural = self._plurals[name]
        if not self._namespaces:
            cluster = custom.list_cluster_custom_object
            return [functools.partial(cluster, group, version, plural, label_selector=selector)]
        namespaced = custom.list_namespaced_custom_object
        return [
            functools.partial(namespaced, group, version, ns, plural, label_selector=selector)
            for ns in self._namespaces
        ]

    def _changed(
        self, kind: Kind, obj: Mapping[str, Any], before: Mapping[str, Any] | None
    ) -> None:
        """A pod or child changed: wake its service (and the one it was labelled for)."""
        self._forget_if_gone(kind, key_of(obj))
        for key in {service_of(obj), service_of(before or {})} - {None}:
            if key is not None and self._wake is not None:
                self._wake(*key)

    def _service_changed(self, obj: Mapping[str, Any], before: Mapping[str, Any] | None) -> None:
        """An InferenceService changed: wake its loop (its pass reads it from here, so kopf's
        own wake-up may come before this cache has the change). If it came, went, started being
        deleted or changed its model name, wake every claimant of the name it claims and of the
        one it claimed before too (a conflict may have begun or ended); other changes (a status
        write) wake no other service: with one name claimed by hundreds of services, each one's
        writes would wake all of them."""
        key = key_of(obj)
        now = self._cached(key)
        self._forget_if_gone(SERVICE, key)
        if self._wake is not None:
            self._wake(*key)
        if _claim(before) == _claim(now):
            return
        for model in {_claim(before)[0], _claim(now)[0]} - {None}:
            for claimant in self._claimants(str(model)):
                if self._wake is not None:
                    self._wake(*claimant)

    def wait_synced(self, kinds: list[Kind], timeout: float) -> None:
        """Wait until every informer of `kinds` (and pods and InferenceServices) has its first
        LIST; TimeoutError after `timeout` seconds (the pass then fails and is retried)."""
        deadline = time.monotonic() + timeout
        for kind in [POD, SERVICE, *kinds]:
            for informer in self._ensure(kind):
                if not informer.wait_synced(max(deadline - time.monotonic(), 0.0)):
                    raise TimeoutError(f"no first LIST of {informer.what} in {timeout:.0f}s")

    def synced_at(self, kinds: list[Kind]) -> float | None:
        """When the last informer of `kinds` (and pods and InferenceServices) had its first LIST
        (`time.monotonic()`), None while one has not."""
        at = [
            informer.synced_at for kind in [POD, SERVICE, *kinds] for informer in self._ensure(kind)
        ]
        listed = [when for when in at if when is not None]
        return max(listed) if len(listed) == len(at) else None

    def of(self, kind: Kind, namespace: str, name: str) -> list[Mapping[str, Any]]:
        """The objects of `kind` labelled `llmfleet.dev/service: name` in `namespace`: as the
        watch brought them, or as this operator's last write of one returned it when that is
        newer or the watch has not brought it yet (`newest`), so that the pass after an apply
        does not apply it again."""
        found = {key_of(obj): obj for obj in self._indexed(kind, (namespace, name))}
        with self._lock:
            mine = self._written.get(kind, {})
            for key, written in list(mine.items()):
                if service_of(written) != (namespace, name):
                    continue
                cached = found.get(key)
                chosen = written if cached is None else newest(cached, written)
                if chosen is written:
                    found[key] = written
                else:
                    del mine[key]  # the watch has caught up (or no version to compare)
        return list(found.values())

    def _cached(self, key: tuple[str, str], kind: Kind = SERVICE) -> Mapping[str, Any] | None:
        for informer in self._ensure(kind):
            found = informer.get(key)
            if found is not None:
                return found
        return None

    def _forget_if_gone(self, kind: Kind, key: tuple[str, str]) -> None:
        """Drop this operator's own copy of an object the watch says is gone."""
        if self._cached(key, kind) is None:
            with self._lock:
                self._written.get(kind, {}).pop(key, None)

    def service(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The InferenceService as the watch brought it, or as this operator's last status
        write returned it when that is newer (`newest`); None when the cache holds none or
        cannot tell which is newer (the caller then GETs it)."""
        key = (namespace, name)
        cached = self._cached(key)
        with self._lock:
            mine = self._written.get(SERVICE, {})
            chosen = newest(cached, mine.get(key))
            if chosen is cached:
                mine.pop(key, None)  # the watch has caught up
        return chosen

    def wrote(self, kind: Kind, obj: Mapping[str, Any]) -> None:
        """An object of `kind` as a write of this operator returned it (kept as the watch's
        copies are, `kept.py`)."""
        obj = transform(kind[1])(obj)
        with self._lock:
            self._written.setdefault(kind, {})[key_of(obj)] = obj

    def claims(self, model: str) -> tuple[tuple[str, str], ...]:
        """(namespace, name) of the InferenceServices (not being deleted) that serve `model`,
        in claim order (`crds.claims`: the first gets the name)."""
        return self._claimants(model)

    def _claimants(self, model: str) -> tuple[tuple[str, str], ...]:
        found = [obj for obj in self._indexed(SERVICE, model)
                 if "deletionTimestamp" not in (obj.get("metadata") or {})]  # fmt: skip
        return tuple(key_of(obj) for obj in sorted(found, key=claim_order))

    def _indexed(self, kind: Kind, key: Hashable) -> list[Mapping[str, Any]]:
        return [obj for informer in self._ensure(kind) for obj in informer.indexed(key)]
