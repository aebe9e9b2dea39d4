"""The operator's memory of every service's pods and children (issue 28): one informer per kind
(`llmfleet.core.informer`: a LIST, then a WATCH resumed from its resourceVersion), with the
server-side label selector `llmfleet.dev/service`, indexed by (namespace, that label). A pass
reads its service's objects from here, with no request, and a change to one of them wakes the
service's loop (`on_change`), after the cache holds it.

The kinds are the children's (`kube.CHILD_KINDS`) and pods; ServiceMonitors are watched from
the first pass that finds their CRD installed. The operator's namespaces are watched one by one
(a Role is enough), all of them when it has none or when one is a pattern.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client

from llmfleet.core.informer import Informer, client_informer
from llmfleet.crds import labels as L

log = logging.getLogger("llmfleet.operator")

Kind = tuple[str, str]
"""(apiVersion, kind) of a watched kind."""
POD: Kind = ("v1", "Pod")
_CORE = {"Pod": "pod", "ConfigMap": "config_map", "Service": "service"}
"""The core kinds' names in `CoreV1Api`'s list methods (other groups go through
`CustomObjectsApi`, which takes any group's plural)."""
Wake = Callable[[str, str], None]
"""Wakes the loop of the service (namespace, name) an object belongs to."""


def service_of(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """(namespace, `llmfleet.dev/service` label) of an object; None without the label."""
    meta = obj.get("metadata") or {}
    service = (meta.get("labels") or {}).get(L.SERVICE)
    return (meta.get("namespace") or "", service) if service else None


class Watched:
    """Pods and children of every service, kept by watches; `start` before reading."""

    def __init__(
        self,
        api: client.ApiClient,
        namespaces: list[str],
        plurals: Mapping[str, str],
        wake: Wake | None = None,
    ) -> None:
        self.api = api
        self._namespaces = [] if any(set("*?[") & set(ns) for ns in namespaces) else namespaces
        self._plurals = plurals
        self._wake = wake
        self._informers: dict[Kind, list[Informer]] = {}
        self._lock = threading.Lock()

    def set_wake(self, wake: Wake) -> None:
        """Who is woken by a change (the handlers' event loop, known once kopf has started)."""
        self._wake = wake

    def start(self, kinds: list[Kind]) -> None:
        """Watch `kinds` (and pods); a kind already watched is left as it is."""
        for kind in [POD, *kinds]:
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
                found = [
                    client_informer(self._plurals[kind[1]], self.api, call, on_change=self._changed,
                                    index=service_of)
                    for call in self._calls(kind)
                ]  # fmt: skip
                for informer in found:
                    informer.start()
                self._informers[kind] = found
            return found

    def _calls(self, kind: Kind) -> list[Callable[..., Any]]:
        """The list calls of `kind` (one per namespace, or one for the cluster), with the
        service label as their server-side selector."""
        api_version, name = kind
        if api_version == "v1":
            core = client.CoreV1Api(self.api)
            method = _CORE[name]
            if not self._namespaces:
                return [functools.partial(getattr(core, f"list_{method}_for_all_namespaces"),
                                          label_selector=L.SERVICE)]  # fmt: skip
            return [
                functools.partial(
                    getattr(core, f"list_namespaced_{method}"), ns, label_selector=L.SERVICE
                )
                for ns in self._namespaces
            ]
        group, version = api_version.split("/")
        custom = client.CustomObjectsApi(self.api)
        plural = self._plurals[name]
        if not self._namespaces:
            return [functools.partial(custom.list_cluster_custom_object, group, version, plural,
                                      label_selector=L.SERVICE)]  # fmt: skip
        return [
            functools.partial(custom.list_namespaced_custom_object, group, version, ns, plural,
                              label_selector=L.SERVICE)
            for ns in self._namespaces
        ]  # fmt: skip

    def _changed(self, obj: Mapping[str, Any]) -> None:
        key = service_of(obj)
        if key is not None and self._wake is not None:
            self._wake(*key)

    def wait_synced(self, kinds: list[Kind], timeout: float) -> None:
        """Wait until every informer of `kinds` (and pods) has its first LIST; TimeoutError
        after `timeout` seconds (the pass then fails and is retried)."""
        deadline = time.monotonic() + timeout
        for kind in [POD, *kinds]:
            for informer in self._ensure(kind):
                if not informer.wait_synced(max(deadline - time.monotonic(), 0.0)):
                    raise TimeoutError(f"no first LIST of {informer.what} in {timeout:.0f}s")

    def of(self, kind: Kind, namespace: str, name: str) -> list[Mapping[str, Any]]:
        """The objects of `kind` labelled `llmfleet.dev/service: name` in `namespace`."""
        return [obj for informer in self._ensure(kind)
                for obj in informer.indexed((namespace, name))]  # fmt: skip
