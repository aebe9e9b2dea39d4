"""What the operator keeps of watched objects (`kept.py`) is all a pass reads: a whole reconcile
pass over the objects as the watches keep them writes exactly what it writes over the whole
objects, in worlds that make each read field matter; and the comparison notices a transform
that drops one of them.

The objects are the local cluster's (`cluster_objects.json`, written by
`bench/operator_cache_memory.py --capture`: one service of 10 pods, its children, read raw from
the API server), changed per world.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from llmfleet.core.informer import Informer
from llmfleet.crds import labels as L
from llmfleet.operator import kept
from llmfleet.operator.drift import APPLIED
from llmfleet.operator.kube import PLURALS, Kube
from llmfleet.operator.observed import ObservedChild
from llmfleet.operator.pools import PodChange
from llmfleet.operator.reconcile import Reconciler
from llmfleet.operator.settings import OperatorSettings
from llmfleet.operator.watched import POD, Watched

SAMPLES = json.loads((Path(__file__).parent / "cluster_objects.json").read_text())
NAMESPACE = SAMPLES["services"][0]["metadata"]["namespace"]
NAME = SAMPLES["services"][0]["metadata"]["name"]
NOW = datetime(2026, 11, 28, 7, 0, tzinfo=UTC)
DEADLINE = 10.0

Transform = Callable[[Mapping[str, Any]], Mapping[str, Any]]
World = dict[str, list[dict[str, Any]]]
"""Plural -> the objects the API server lists."""


def captured() -> World:
    world: World = {"pods": copy.deepcopy(SAMPLES["pods"]),
                    "inferenceservices": copy.deepcopy(SAMPLES["services"])}  # fmt: skip
    for kind, items in SAMPLES["children"].items():
        world.setdefault(PLURALS[kind], []).extend(copy.deepcopy(items))
    return world


def named(world: World, plural: str, name_part: str) -> dict[str, Any]:
    return next(o for o in world[plural] if name_part in o["metadata"]["name"])


def pods_in_every_state(world: World) -> None:
    """A terminating pod, a demoted one draining (asked for its requests in flight), a canary's,
    one Pending as Unschedulable, one of a revision-named Deployment, another deletion cost."""
    first, second = world["pods"][:2]
    first["metadata"]["deletionTimestamp"] = "2026-11-28T06:59:00Z"
    second["metadata"]["labels"][L.SERVING] = "false"
    second["metadata"]["annotations"][L.DEMOTED_AT] = "2026-11-28T06:58:30Z"
    canary, pending, revisioned = (copy.deepcopy(second) for _ in range(3))
    for number, pod in enumerate((canary, pending, revisioned), start=3):
        pod["metadata"]["name"] = f"{NAME}-unified-{number}"
        pod["metadata"]["uid"] = f"uid-{number}"
        pod["metadata"]["annotations"].pop(L.DEMOTED_AT)
        pod["status"]["podIP"] = f"10.0.0.{number}"
    canary["metadata"]["labels"][L.SERVING] = L.SERVING_CANARY
    canary["metadata"]["annotations"][L.DELETION_COST] = "-5"
    revisioned["metadata"]["labels"][L.DEPLOYMENT] = f"{NAME}-unified-abc123"
    pending["status"] = {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                        "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
                        "lastProbeTime": None,
                        "lastTransitionTime": "2026-11-28T06:59:00Z"}],
    }  # fmt: skip
    world["pods"] += [canary, pending, revisioned]


def children_edited(world: World) -> None:
    """Hand edits the operator reverts: a Deployment's replicas, a label taken off a Service,
    a ConfigMap's data, another manifest's digest on the NetworkPolicy."""
    named(world, "deployments", "unified")["spec"]["replicas"] = 3
    del named(world, "services", "unified")["metadata"]["labels"][L.POOL]
    config = named(world, "configmaps", "runtime")
    config["data"] = {key: value + " " for key, value in config["data"].items()}
    named(world, "networkpolicies", NAME)["metadata"]["annotations"][APPLIED] = "another"


def a_pool_service_with_a_cluster_ip(world: World) -> None:
    """A pool Service an older operator made with an address (`drift.kept_immutable`)."""
    service = named(world, "services", "unified")
    service["spec"]["clusterIP"] = "10.96.0.12"
    service["spec"]["clusterIPs"] = ["10.96.0.12"]


def a_pool_retired(world: World) -> None:
    """Children and pods of a pool the spec no longer has (pruned once it has no endpoints)."""
    for plural in ("deployments", "services", "poddisruptionbudgets", "pods"):
        for item in list(world[plural]):
            if item["metadata"].get("labels", {}).get(L.POOL) == "unified":
                old = copy.deepcopy(item)
                old["metadata"]["name"] = item["metadata"]["name"].replace("unified", "old")
                old["metadata"]["uid"] = f"old-{item['metadata']['uid']}"
                old["metadata"]["labels"][L.POOL] = "old"
                world[plural].append(old)


WORLDS: dict[str, Callable[[World], None]] = {
    "as-captured": lambda world: None,
    "pods-in-every-state": pods_in_every_state,
    "children-edited": children_edited,
    "a-pool-service-with-a-cluster-ip": a_pool_service_with_a_cluster_ip,
    "a-pool-retired": a_pool_retired,
}


class FakeServer:
    """Each plural's LIST from a world, then watches that bring nothing."""

    def __init__(self, world: World, transform: Callable[[str, Transform | None], Any]) -> None:
        self.world = world
        self.transform = transform
        self.stopped = threading.Event()

    def informer(self, what: str, **options: Any) -> Informer:
        def watch(version: str) -> Iterator[Mapping[str, Any]]:
            self.stopped.wait(0.05)  # a watch the server ends with no event
            yield from ()

        items = copy.deepcopy(self.world.get(what, []))
        listing = {"metadata": {"resourceVersion": "1"}, "items": items}
        options.pop("call")
        options["transform"] = self.transform(what, options.get("transform"))
        return Informer(what, lambda: listing, watch, **options)


class Recorded(Kube):
    """The operator's `Kube` with the API server's answers stubbed and every write recorded."""

    def __init__(self, watched: Watched) -> None:
        super().__init__(client.ApiClient(), "llmfleet-operator", watched,
                         in_flight=lambda ip, port: int(ip.rsplit(".", 1)[-1]),
                         sync_timeout=DEADLINE)  # fmt: skip
        self.writes: list[Any] = []

    def service_monitor_crd(self) -> bool:
        return False

    def gpu_node_products(self) -> tuple[str, ...] | None:
        return ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-80GB-HBM3")

    def ready_endpoints(self, namespace: str, name: str) -> dict[str, int]:
        return {}

    def apply(self, manifest: Mapping[str, Any]) -> None:
        self.writes.append(("apply", json.dumps(manifest, sort_keys=True)))

    def delete_child(self, child: ObservedChild) -> None:
        self.writes.append(("delete", child.key, child.uid))

    def change_pod(self, namespace: str, change: PodChange) -> None:
        self.writes.append(("pod", change))

    def write_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        self.writes.append(("status", json.dumps(status, sort_keys=True, default=str)))

    def event(self, owner: Mapping[str, Any], reason: str, message: str,
              warning: bool = False) -> None:  # fmt: skip
        self.writes.append(("event", reason, message, warning))


def one_pass(world: World, transform: Callable[[str, Transform | None], Any]) -> Any:
    """What one reconcile pass of the service reads (its observation) and writes, with the
    informers' transforms chosen by `transform(plural, the operator's own)`."""
    server = FakeServer(world, transform)
    watched = Watched(client.ApiClient(), [NAMESPACE], PLURALS, informer=server.informer)
    kube = Recorded(watched)
    watched.start([])
    try:
        body = kube.get_service(NAMESPACE, NAME)
        assert body is not None
        spec = body["spec"]
        pools = {"unified": spec["topology"]["unified"]}
        observed = kube.observe(NAMESPACE, NAME, body.get("status") or {}, pools,
                                spec["model"]["name"])  # fmt: skip
        requeue = Reconciler(kube, OperatorSettings(), clock=lambda: NOW).reconcile(NAMESPACE, NAME)
    finally:
        server.stopped.set()
        watched.stop()
    children = [(c, json.dumps(c.body, sort_keys=True)) for c in observed.children]
    return observed, kube.writes, requeue, children


def operators(plural: str, own: Transform | None) -> Transform | None:
    return own


def none(plural: str, own: Transform | None) -> Transform | None:
    return None


@pytest.mark.parametrize("world", list(WORLDS))
def test_a_pass_over_the_kept_objects_reads_and_writes_what_it_does_over_the_whole_ones(
    world: str,
) -> None:
    objects = captured()
    WORLDS[world](objects)
    observed, writes, requeue, _ = one_pass(objects, operators)
    assert (observed, writes, requeue) == one_pass(objects, none)[:3]


def dropping(plural: str, path: tuple[str, ...]) -> Callable[[str, Transform | None], Any]:
    """The operator's transforms, but `plural`'s also drops the field at `path`."""

    def chosen(what: str, own: Transform | None) -> Transform | None:
        if what != plural or own is None:
            return own
        keep = own

        def drop(obj: Mapping[str, Any]) -> Mapping[str, Any]:
            found = copy.deepcopy(dict(keep(obj)))
            parent = found
            for key in path[:-1]:
                parent = parent.get(key) or {}
            parent.pop(path[-1], None)
            return found

        return drop

    return chosen


@pytest.mark.parametrize(
    ("world", "plural", "path"),
    [
        pytest.param("pods-in-every-state", "pods", ("status", "podIP"), id="pod-ip"),
        pytest.param("pods-in-every-state", "pods", ("status", "conditions"), id="conditions"),
        pytest.param("pods-in-every-state", "pods", ("metadata", "annotations"),
                     id="pod-annotations"),
        pytest.param("pods-in-every-state", "pods", ("metadata", "deletionTimestamp"),
                     id="deletion-timestamp"),
        pytest.param("as-captured", "pods", ("metadata", "creationTimestamp"), id="created"),
        pytest.param("as-captured", "deployments", ("spec",), id="a-child-s-spec"),
        pytest.param("a-pool-service-with-a-cluster-ip", "services", ("spec", "clusterIP"),
                     id="cluster-ip"),
        pytest.param("as-captured", "inferenceservices", ("status",), id="service-status"),
    ],
)  # fmt: skip
def test_the_comparison_notices_a_dropped_field_that_a_pass_reads(
    world: str, plural: str, path: tuple[str, ...]
) -> None:
    objects = captured()
    WORLDS[world](objects)
    whole = one_pass(objects, none)
    assert one_pass(objects, dropping(plural, path))[:3] != whole[:3]


def test_children_and_services_are_kept_whole_but_for_managed_fields() -> None:
    world = captured()
    _, _, _, children = one_pass(world, operators)
    _, _, _, whole = one_pass(world, none)
    assert len(children) == len(whole) == 6
    for (_, body), (_, original) in zip(children, whole, strict=True):
        expected = json.loads(original)
        assert "managedFields" in expected["metadata"]
        del expected["metadata"]["managedFields"]
        assert json.loads(body) == expected
    service = SAMPLES["services"][0]
    assert kept.transform("InferenceService")(service) == {
        **service, "metadata": {k: v for k, v in service["metadata"].items()
                                if k != "managedFields"}}  # fmt: skip


def test_a_kept_pod_has_only_the_fields_the_passes_read() -> None:
    pod = SAMPLES["pods"][0]
    before = json.dumps(pod, sort_keys=True)
    found = kept.pod(pod)
    assert json.dumps(pod, sort_keys=True) == before, "the object given is not changed"
    assert sorted(found) == ["metadata", "status"]
    assert sorted(found["metadata"]) == sorted(set(kept.POD_METADATA) & set(pod["metadata"]))
    assert sorted(found["status"]) == ["conditions", "phase", "podIP"]
    assert {key for c in found["status"]["conditions"] for key in c} <= set(kept.CONDITION)
    assert kept.pod(found) == found, "keeping what is kept changes nothing"
    # One copy of each repeated string for every pod.
    other = kept.pod(json.loads(json.dumps(SAMPLES["pods"][1])))
    assert other["metadata"]["namespace"] is found["metadata"]["namespace"]
    service = L.SERVICE
    assert other["metadata"]["labels"][service] is found["metadata"]["labels"][service]


def test_the_operator_s_own_writes_are_kept_as_the_watch_s_copies() -> None:
    server = FakeServer({}, operators)
    watched = Watched(client.ApiClient(), [NAMESPACE], PLURALS, informer=server.informer)
    watched.start([])
    try:
        watched.wait_synced([], DEADLINE)
        watched.wrote(POD, SAMPLES["pods"][0])
        assert watched.of(POD, NAMESPACE, NAME) == [kept.pod(SAMPLES["pods"][0])]
    finally:
        server.stopped.set()
        watched.stop()
