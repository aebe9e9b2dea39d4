"""What the autoscaler keeps of an engine pod (`kept.py`) is all a pass reads: the pods a pass
counts (`Kube.list_pods`, each pod's `PodView` under its service) are the same from the pods as
the watch keeps them and from the whole pods, in worlds that make each read field matter; and
the comparison notices a transform that drops one of them.

The pods are the local cluster's (`tests/operator/cluster_objects.json`, read raw from the API
server by `bench/operator_cache_memory.py --capture`), changed per world. The informer itself
needs `metadata.name` and `resourceVersion` of what it keeps (`core/informer.py`).
"""

from __future__ import annotations

import copy
import functools
import json
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from llmfleet.autoscaler import kept
from llmfleet.autoscaler.kube import Kube
from llmfleet.autoscaler.pods import PodView
from llmfleet.core.informer import Informer, Transform
from llmfleet.crds import labels as L

SAMPLES = json.loads((Path(__file__).parents[1] / "operator" / "cluster_objects.json").read_text())
NAMESPACE = SAMPLES["pods"][0]["metadata"]["namespace"]
SERVICE = SAMPLES["pods"][0]["metadata"]["labels"][L.SERVICE]
DEADLINE = 10.0

Pods = list[dict[str, Any]]


def captured() -> Pods:
    pods: Pods = copy.deepcopy(SAMPLES["pods"])
    assert len(pods) >= 2
    assert all("managedFields" in pod["metadata"] for pod in pods)
    return pods


def _copy(pod: dict[str, Any], number: int) -> dict[str, Any]:
    made = copy.deepcopy(pod)
    made["metadata"]["name"] = f"{SERVICE}-unified-{number}"
    made["metadata"]["uid"] = f"uid-{number}"
    return made


def pods_in_every_state(pods: Pods) -> None:
    """A terminating pod, a warm spare (not serving), a canary's, one starting (scheduled, not
    Ready), one Pending as Unschedulable, one of another pool, of another service and of
    another namespace, and one with no status yet."""
    first, second = pods[:2]
    first["metadata"]["deletionTimestamp"] = "2026-11-28T06:59:00Z"
    second["metadata"]["labels"][L.SERVING] = "false"
    made = [_copy(second, number) for number in range(3, 10)]
    canary, starting, pending, decode, other, elsewhere, fresh = made
    canary["metadata"]["labels"][L.SERVING] = L.SERVING_CANARY
    for pod in (starting, decode, other, elsewhere):
        pod["metadata"]["labels"][L.SERVING] = "true"
    for condition in starting["status"]["conditions"]:
        if condition["type"] in ("Ready", "ContainersReady"):
            condition.update(status="False", reason="ContainersNotReady")
    pending["status"] = {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                        "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
                        "lastProbeTime": None,
                        "lastTransitionTime": "2026-11-28T06:59:00Z"}],
    }  # fmt: skip
    decode["metadata"]["labels"][L.POOL] = "decode"
    other["metadata"]["labels"][L.SERVICE] = "another"
    elsewhere["metadata"]["namespace"] = "elsewhere"
    del fresh["status"]
    pods += made


WORLDS: dict[str, Callable[[Pods], None]] = {
    "as-captured": lambda pods: None,
    "pods-in-every-state": pods_in_every_state,
}


class FakeServer:
    """Each namespace's LIST of the world's pods, then watches that bring nothing; keeps the
    transform the autoscaler asked each informer for."""

    def __init__(self, pods: Pods, keep: Callable[[Transform | None], Transform | None]) -> None:
        self.pods = pods
        self.keep = keep
        self.asked: dict[str, Transform | None] = {}
        self.stopped = threading.Event()

    def informer(
        self, what: str, call: Callable[..., Any], transform: Transform | None = None
    ) -> Informer:
        def watch(version: str) -> Iterator[Mapping[str, Any]]:
            self.stopped.wait(0.05)  # a watch the server ends with no event
            yield from ()

        self.asked[what] = transform
        items: Pods = []
        if what == "pods":
            assert isinstance(call, functools.partial)
            (namespace,) = call.args  # list_namespaced_pod's
            items = [copy.deepcopy(p) for p in self.pods if p["metadata"]["namespace"] == namespace]
        listing = {"metadata": {"resourceVersion": "1"}, "items": items}
        return Informer(what, lambda: listing, watch, transform=self.keep(transform))


def counted(
    pods: Pods, keep: Callable[[Transform | None], Transform | None]
) -> tuple[dict[tuple[str, str], list[PodView]], dict[str, Transform | None]]:
    """The pods a pass counts, with the pod informers' transform chosen by `keep(the
    autoscaler's own)`, and the transform the autoscaler asked for."""
    server = FakeServer(pods, keep)
    kube = Kube(client.ApiClient(), [NAMESPACE, "elsewhere"], "llmfleet-autoscaler",
                sync_timeout=DEADLINE, informer=server.informer)  # fmt: skip
    try:
        found = kube.list_pods()
    finally:
        server.stopped.set()
        kube.stop()
    return {key: sorted(views, key=repr) for key, views in found.items()}, server.asked


def autoscalers(own: Transform | None) -> Transform | None:
    return own


def whole(own: Transform | None) -> Transform | None:
    return None


@pytest.mark.parametrize("world", list(WORLDS))
def test_a_pass_counts_the_kept_pods_as_it_counts_the_whole_ones(world: str) -> None:
    pods = captured()
    WORLDS[world](pods)
    found, asked = counted(pods, autoscalers)
    assert asked == {"pods": kept.pod}
    assert found == counted(pods, whole)[0]
    assert sum(len(views) for views in found.values()) == len(pods)


def test_the_worlds_count_pods_in_every_state() -> None:
    pods = captured()
    pods_in_every_state(pods)
    found, _ = counted(pods, autoscalers)
    assert set(found) == {("elsewhere", SERVICE), (NAMESPACE, "another"), (NAMESPACE, SERVICE)}
    views = found[(NAMESPACE, SERVICE)]
    assert {view.pool for view in views} == {"unified", "decode"}
    assert sum(view.terminating for view in views) == 1
    assert sum(view.unschedulable for view in views) == 1
    assert sum(view.ready and not view.serving for view in views) == 2  # a spare, a canary's
    assert sum(not view.ready for view in views) == 3  # starting, pending, no status yet


def dropping(path: tuple[str, ...]) -> Callable[[Transform | None], Transform | None]:
    """The autoscaler's transform, but also dropping the field at `path` (`type=X` in a list:
    the items of that type)."""

    def drop(value: Any, path: tuple[str, ...]) -> Any:
        head, rest = path[0], path[1:]
        if isinstance(value, list):
            kind = head.removeprefix("type=")
            if not rest:
                return [item for item in value if item.get("type") != kind]
            return [drop(item, rest) if item.get("type") == kind else item for item in value]
        if head not in value:
            return value
        if not rest:
            return {key: item for key, item in value.items() if key != head}
        return {**value, head: drop(value[head], rest)}

    def chosen(own: Transform | None) -> Transform | None:
        assert own is not None
        keep = own
        return lambda obj: drop(keep(obj), path)

    return chosen


@pytest.mark.parametrize(
    ("world", "path"),
    [
        pytest.param("as-captured", ("metadata", "namespace"), id="namespace"),
        pytest.param("as-captured", ("metadata", "labels", L.SERVICE), id="service-label"),
        pytest.param("as-captured", ("metadata", "labels", L.POOL), id="pool-label"),
        pytest.param("as-captured", ("metadata", "labels", L.SERVING), id="serving-label"),
        pytest.param("pods-in-every-state", ("metadata", "deletionTimestamp"),
                     id="deletion-timestamp"),
        pytest.param("as-captured", ("status",), id="status"),
        pytest.param("as-captured", ("status", "conditions"), id="conditions"),
        pytest.param("as-captured", ("status", "conditions", "type=Ready"), id="ready"),
        pytest.param("as-captured", ("status", "conditions", "type=Ready", "status"),
                     id="ready-status"),
        pytest.param("pods-in-every-state", ("status", "conditions", "type=PodScheduled"),
                     id="scheduled"),
        pytest.param("pods-in-every-state",
                     ("status", "conditions", "type=PodScheduled", "status"),
                     id="scheduled-status"),
        pytest.param("pods-in-every-state",
                     ("status", "conditions", "type=PodScheduled", "reason"),
                     id="scheduled-reason"),
    ],
)  # fmt: skip
def test_the_comparison_notices_a_dropped_field_that_a_pass_reads(
    world: str, path: tuple[str, ...]
) -> None:
    pods = captured()
    WORLDS[world](pods)
    assert counted(pods, dropping(path))[0] != counted(pods, whole)[0]


def test_a_kept_pod_has_only_the_fields_a_pass_reads() -> None:
    pod = SAMPLES["pods"][0]
    before = json.dumps(pod, sort_keys=True)
    found = kept.pod(pod)
    assert json.dumps(pod, sort_keys=True) == before, "the object given is not changed"
    assert found == {
        "metadata": {
            "name": pod["metadata"]["name"],
            "namespace": NAMESPACE,
            "resourceVersion": pod["metadata"]["resourceVersion"],
            "labels": {L.SERVICE: SERVICE, L.POOL: "unified", L.SERVING: "true"},
        },
        "status": {"conditions": [{"type": "Ready", "status": "True"},
                                  {"type": "PodScheduled", "status": "True"}]},
    }  # fmt: skip
    assert kept.pod(found) == found, "keeping what is kept changes nothing"
    assert kept.pod({"metadata": {"name": "bare"}}) == {"metadata": {"name": "bare"}}
    # One copy of each repeated string for every pod.
    other = kept.pod(json.loads(json.dumps(SAMPLES["pods"][1])))
    assert other["metadata"]["namespace"] is found["metadata"]["namespace"]
    assert other["metadata"]["labels"][L.SERVICE] is found["metadata"]["labels"][L.SERVICE]
    assert other["status"]["conditions"][0]["type"] is found["status"]["conditions"][0]["type"]
