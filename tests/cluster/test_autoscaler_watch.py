"""The autoscaler's services and engine pods come from watches (issue 28): once its caches have
synced, a pass sends no LIST of pods or InferenceServices (counted by the API server,
`apiserver_request_total`), the pods it counts follow pods created, relabelled and deleted, and
the services it reads follow spec changes and its own status writes.

The autoscaler runs in this process against the real API server with a scripted signal source;
no operator runs, so the pods are made here (Pending: no node matches their selector).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

import pytest

from llmfleet.autoscaler.kube import Kube as AutoscalerKube
from llmfleet.autoscaler.loop import Autoscaler
from llmfleet.autoscaler.metrics import AutoscalerMetrics
from llmfleet.autoscaler.pods import PodView
from llmfleet.core.informer import (
    Informer,
    Transform,
    Watcher,
    client_lister,
    client_watcher,
)
from llmfleet.crds import labels as L
from tests.cluster.api_counts import api_requests, since
from tests.cluster.kube import Kube, install_crds
from tests.cluster.test_autoscaler import ScriptedLoad

pytestmark = pytest.mark.cluster

SERVICE = "watched"
READS = frozenset({("pods", ""), ("inferenceservices", "")})
FOLLOW_SECONDS = 10
"""Deadline for a change to a pod or a service to reach the autoscaler's cache."""
PASSES = 10
STRAY_LISTS = 2
"""LISTs of InferenceServices the window may count that no pass sent: the cluster's own
controllers (garbage collector, resource quota) LIST a kind once each when discovery shows it
new, as after `install_crds`, and the count does not say who asked. A LIST per pass would be
`PASSES`."""


def pod(name: str, service: str = SERVICE, serving: str = "true") -> str:
    return json.dumps({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {L.SERVICE: service, L.POOL: "unified",
                                              L.SERVING: serving}},
        "spec": {"nodeSelector": {"llmfleet.dev/no-such-node": "true"},
                 "containers": [{"name": "engine", "image": "engine:none"}]},
    })  # fmt: skip


class HeldServices:
    """Informers whose InferenceService watch holds every event back until `released` is set (a
    watch that lags the autoscaler's own writes); the pods' watch is left alone."""

    def __init__(self, kube: Kube) -> None:
        self.api = kube.api()
        self.released = threading.Event()

    def __call__(
        self, what: str, call: Callable[..., Any], transform: Transform | None = None
    ) -> Informer:
        watcher = client_watcher(self.api, call)
        held = self._held(watcher) if what == "inferenceservices" else watcher
        return Informer(what, client_lister(self.api, call), held, interrupt=watcher.interrupt,
                        transform=transform)  # fmt: skip

    def _held(self, watcher: Watcher) -> Watcher:
        def watch(version: str) -> Iterable[Mapping[str, Any]]:
            for event in watcher(version):
                self.released.wait()
                yield event

        return watch


def create_service_and_pods(kube: Kube, namespace: str) -> None:
    install_crds(kube)
    service = {
        "apiVersion": "llmfleet.dev/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": SERVICE},
        "spec": {"model": {"name": "org/watched"}, "runtime": {"gpu": {"type": "H100"}},
                 "topology": {"mode": "Unified", "unified": {"replicas": 2}},
                 "autoscaling": {"enabled": True}},
    }  # fmt: skip
    kube.kubectl("create", "-n", namespace, "-f", "-", stdin=json.dumps(service))
    for name in ("engine-1", "engine-2"):
        kube.kubectl("create", "-n", namespace, "-f", "-", stdin=pod(name))


@pytest.fixture
def scaler(kube: Kube, namespace: str) -> Iterator[Autoscaler]:
    create_service_and_pods(kube, namespace)
    kube_io = AutoscalerKube(kube.api(), [namespace], "llmfleet-autoscaler")
    try:
        yield Autoscaler(kube_io, ScriptedLoad(rate=1.0), AutoscalerMetrics())
    finally:
        kube_io.stop()


def counted(scaler: Autoscaler, namespace: str) -> list[PodView]:
    return scaler.kube.list_pods().get((namespace, SERVICE), [])


def test_a_pass_lists_no_pods_once_synced_and_the_pods_follow_changes(
    kube: Kube, namespace: str, scaler: Autoscaler
) -> None:
    scaler.run_once(datetime.now(UTC))  # the first pass waits for the first LIST
    kube.wait_for(lambda: len(counted(scaler, namespace)) == 2, FOLLOW_SECONDS, "both pods")

    before = api_requests(kube, {"LIST"}, READS)
    for _ in range(PASSES):
        scaler.run_once(datetime.now(UTC))
    listed = since(before, api_requests(kube, {"LIST"}, READS))
    assert ("LIST", "pods", "") not in listed, f"passes listed pods: {listed}"
    services = listed.get(("LIST", "inferenceservices", ""), 0)
    assert services <= STRAY_LISTS, f"{PASSES} passes listed services: {listed}"

    kube.kubectl("create", "-n", namespace, "-f", "-", stdin=pod("engine-3"))
    kube.wait_for(lambda: len(counted(scaler, namespace)) == 3, FOLLOW_SECONDS, "a new pod")

    kube.kubectl("label", "-n", namespace, "pod", "engine-1", f"{L.SERVING}=false",
                 "--overwrite")  # fmt: skip
    kube.wait_for(
        lambda: sum(not view.serving for view in counted(scaler, namespace)) == 1,
        FOLLOW_SECONDS,
        "a pod relabelled out of serving",
    )
    kube.kubectl("label", "-n", namespace, "pod", "engine-2", f"{L.SERVICE}=another",
                 "--overwrite")  # fmt: skip
    kube.wait_for(
        lambda: (
            len(counted(scaler, namespace)) == 2
            and len(scaler.kube.list_pods().get((namespace, "another"), [])) == 1
        ),
        FOLLOW_SECONDS,
        "a pod relabelled to another service",
    )
    kube.kubectl("delete", "-n", namespace, "pod", "engine-3", "--grace-period=0", "--force")
    kube.wait_for(lambda: len(counted(scaler, namespace)) == 1, FOLLOW_SECONDS, "a deleted pod")
    assert [view.serving for view in counted(scaler, namespace)] == [False]


@pytest.fixture
def held(kube: Kube, namespace: str) -> Iterator[tuple[Autoscaler, threading.Event]]:
    """An autoscaler whose services' watch brings nothing until the test sets the event."""
    create_service_and_pods(kube, namespace)
    informers = HeldServices(kube)
    kube_io = AutoscalerKube(kube.api(), [namespace], "llmfleet-autoscaler", informer=informers)
    try:
        yield Autoscaler(kube_io, ScriptedLoad(rate=1.0), AutoscalerMetrics()), informers.released
    finally:
        informers.released.set()
        kube_io.stop()


def test_the_pass_after_a_write_reads_it_before_the_watch_brings_it_and_specs_are_followed(
    kube: Kube, namespace: str, held: tuple[Autoscaler, threading.Event]
) -> None:
    scaler, release = held
    (first,) = scaler.run_once(datetime.now(UTC))
    assert first.written, "the first pass sized an unsized service and wrote nothing"
    # The watch has brought nothing since the first LIST: the service reads as the write
    # returned it, so the next pass finds the status it would write and writes nothing.
    (read,) = [body for body in scaler.kube.list_services()
               if body["metadata"]["name"] == SERVICE]  # fmt: skip
    assert ((read.get("status") or {}).get("autoscaling") or {}).get("lastDecisionTime"), read
    (second,) = scaler.run_once(datetime.now(UTC))
    assert not second.written, "the pass after a write wrote it again"

    release.set()
    kube.kubectl("patch", "-n", namespace, "inferenceservice", SERVICE, "--type=merge",
                 "-p", json.dumps({"spec": {"autoscaling": {"enabled": False}}}))  # fmt: skip
    kube.wait_for(
        lambda: scaler.run_once(datetime.now(UTC)) == [],
        FOLLOW_SECONDS,
        "a service whose autoscaling was turned off left alone",
    )
