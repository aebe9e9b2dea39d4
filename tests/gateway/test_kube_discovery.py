"""Kubernetes discovery, pure part: InferenceServices + EndpointSlices -> served models."""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from llmfleet.crds import labels as L
from llmfleet.gateway.from_objects import Built, Specs, changes, snapshot
from llmfleet.gateway.kube_discovery import Changes, KubeDiscovery, kept_service, kept_slice


def service(name: str, spec: dict[str, Any], **metadata: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", **metadata}, "spec": spec}


def endpoint_slice(pool_service: str, *endpoints: tuple[str, bool, bool]) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "labels": {"kubernetes.io/service-name": pool_service}},
        "ports": [{"name": "http", "port": 8000}],
        "endpoints": [
            {"addresses": [ip], "conditions": {"ready": ready, "terminating": terminating}}
            for ip, ready, terminating in endpoints
        ],
    }


UNIFIED = {"model": {"name": "org/llama", "servedName": "llama"},
           "topology": {"unified": {"replicas": 2}},
           "slo": {"maxKvCacheUsage": 0.6},
           "traffic": {"limits": {"maxTokens": 512, "timeoutSeconds": 30},
                       "coalesce": {"enabled": True, "windowMs": 250},
                       "cascade": {"tiers": [{"service": "small"}], "hedge": True}}}  # fmt: skip
PD = {"model": {"name": "org/big"}, "topology": {
    "mode": "Disaggregated", "prefill": {"replicas": 1}, "decode": {"replicas": 1},
    "kvTransfer": {"connector": "NixlConnector"}}}  # fmt: skip


@pytest.mark.parametrize(
    ("services", "slices", "expected"),
    [
        pytest.param(
            [service("llama", UNIFIED)],
            [endpoint_slice("llama-unified", ("10.0.0.1", True, False), ("10.0.0.2", True, False))],
            {"llama": {"unified": ("http://10.0.0.1:8000", "http://10.0.0.2:8000")}},
            id="unified-two-serving",
        ),
        pytest.param(
            [service("llama", UNIFIED)],
            [endpoint_slice("llama-unified", ("10.0.0.1", True, False), ("10.0.0.2", False, False),
                            ("10.0.0.3", False, True))],
            {"llama": {"unified": ("http://10.0.0.1:8000",)}},
            id="not-ready-and-terminating-left-out",
        ),
        pytest.param(
            [service("big", PD)],
            [endpoint_slice("big-prefill", ("10.0.1.1", True, False)),
             endpoint_slice("big-decode", ("10.0.1.2", True, False))],
            {"org/big": {"prefill": ("http://10.0.1.1:8000",),
                         "decode": ("http://10.0.1.2:8000",)}},
            id="disaggregated-pools",
        ),
        pytest.param(
            [service("llama", UNIFIED)], [], {"llama": {"unified": ()}}, id="no-endpoints-yet",
        ),
        pytest.param(
            [service("big", PD)],
            [endpoint_slice("big-unified", ("10.0.0.1", True, False))],
            {"org/big": {"unified": ("http://10.0.0.1:8000",)}},
            id="to-disaggregated-old-unified-serves-until-decode-is-ready",
        ),
        pytest.param(
            [service("big", PD)],
            [endpoint_slice("big-unified", ("10.0.0.1", True, False)),
             endpoint_slice("big-decode", ("10.0.1.2", True, False))],
            {"org/big": {"prefill": (), "decode": ("http://10.0.1.2:8000",)}},
            id="to-disaggregated-decode-ready-takes-over",
        ),
        pytest.param(
            [service("llama", UNIFIED)],
            [endpoint_slice("llama-prefill", ("10.0.1.1", True, False)),
             endpoint_slice("llama-decode", ("10.0.1.2", True, False))],
            {"llama": {"prefill": ("http://10.0.1.1:8000",),
                       "decode": ("http://10.0.1.2:8000",)}},
            id="back-to-unified-old-pools-serve-until-unified-is-ready",
        ),
        pytest.param(
            [service("llama", UNIFIED)],
            [endpoint_slice("llama-prefill", ("10.0.1.1", True, False)),
             endpoint_slice("llama-unified", ("10.0.0.1", True, False))],
            {"llama": {"unified": ("http://10.0.0.1:8000",)}},
            id="back-to-unified-unified-ready-takes-over",
        ),
        pytest.param(
            [service("llama", UNIFIED, deletionTimestamp="2026-11-23T00:00:00Z")],
            [endpoint_slice("llama-unified", ("10.0.0.1", True, False))], {},
            id="deleted-service-left-out",
        ),
        pytest.param(
            [service("a", UNIFIED), service("b", UNIFIED)],
            [endpoint_slice("a-unified", ("10.0.0.1", True, False)),
             endpoint_slice("b-unified", ("10.0.0.9", True, False))],
            {"llama": {"unified": ("http://10.0.0.1:8000",)}},
            id="duplicate-model-keeps-the-first",
        ),
        pytest.param(
            [service("bad", {"model": {"name": "x"}, "topology": {"mode": "Hybrid"}})], [], {},
            id="invalid-spec-skipped",
        ),
    ],
)  # fmt: skip
@pytest.mark.parametrize("kept", [False, True], ids=["whole", "kept"])
def test_snapshot(
    services: list[dict[str, Any]],
    slices: list[dict[str, Any]],
    expected: dict[str, Any],
    kept: bool,
) -> None:
    if kept:  # what the informers keep gives the same snapshot
        services, slices = [kept_service(o) for o in services], [kept_slice(o) for o in slices]
    found = snapshot(services, slices)
    assert {model: {role: pool.endpoints for role, pool in svc.pools.items()}
            for model, svc in found.items()} == expected  # fmt: skip


def test_limits_and_identity_come_from_the_service() -> None:
    found = snapshot([service("llama", UNIFIED)], [])["llama"]
    assert (found.namespace, found.name) == ("ns", "llama")
    assert (found.limits.max_tokens, found.limits.timeout_seconds) == (512, 30)
    assert not found.disaggregated


def test_traffic_policies_and_slo_come_from_the_service() -> None:
    found = snapshot([service("llama", UNIFIED)], [])["llama"]
    assert (found.traffic.coalesce.enabled, found.traffic.coalesce.window_ms) == (True, 250)
    assert [tier.service for tier in found.traffic.cascade.tiers] == ["small"]
    assert found.traffic.cascade.hedge
    assert found.slo.max_kv_cache_usage == 0.6


def test_changes_name_each_pool_whose_endpoints_changed_and_nothing_else() -> None:
    two = [endpoint_slice("llama-unified", ("10.0.0.1", True, False), ("10.0.0.2", True, False))]
    one = [endpoint_slice("llama-unified", ("10.0.0.1", True, False), ("10.0.0.2", False, False))]
    pd = [endpoint_slice("big-prefill", ("10.0.1.1", True, False))]
    first = snapshot([service("llama", UNIFIED), service("big", PD)], [*two, *pd])
    assert changes({}, first) == [
        "model 'llama' served by ns/llama",
        "model 'llama' (ns/llama) pool unified: serving endpoints "
        "http://10.0.0.1:8000, http://10.0.0.2:8000",
        "model 'org/big' served by ns/big",
        "model 'org/big' (ns/big) pool decode: serving endpoints none",
        "model 'org/big' (ns/big) pool prefill: serving endpoints http://10.0.1.1:8000",
    ]
    assert (
        changes(first, snapshot([service("llama", UNIFIED), service("big", PD)], [*two, *pd])) == []
    )
    later = snapshot([service("llama", UNIFIED)], one)
    assert changes(first, later) == [
        "model 'org/big' is gone",
        "model 'llama' (ns/llama) pool unified: serving endpoints http://10.0.0.1:8000",
    ]


@pytest.mark.parametrize(
    ("services", "said"),
    [
        pytest.param([service("a", UNIFIED), service("b", UNIFIED)],
                     ["model 'llama' is served by ns/a and ns/b; routing to the first created"],
                     id="conflict-named-with-both-services"),
        pytest.param([service("bad", {"model": {"name": "x"}, "topology": {"mode": "Hybrid"}})],
                     ["skipping ns/bad: invalid spec"], id="invalid-spec"),
        pytest.param([service("a", UNIFIED)], [], id="none"),
    ],
)  # fmt: skip
def test_what_is_left_out_is_said_in_problems(
    services: list[dict[str, Any]], said: list[str]
) -> None:
    problems: list[str] = []
    snapshot(services, [], problems)
    assert [line[: len(prefix)] for line, prefix in zip(problems, said, strict=True)] == said


@pytest.mark.parametrize(
    "reverse", [False, True], ids=["listed-oldest-first", "listed-newest-first"]
)
def test_a_model_name_claimed_twice_goes_to_the_service_created_first(reverse: bool) -> None:
    older = service("zeta", UNIFIED, creationTimestamp="2026-01-01T00:00:00Z")
    newer = service("alpha", UNIFIED, creationTimestamp="2026-02-01T00:00:00Z")
    listed = [newer, older] if reverse else [older, newer]
    problems: list[str] = []
    found = snapshot(listed, [], problems)
    assert found["llama"].name == "zeta"
    assert problems == [
        "model 'llama' is served by ns/zeta and ns/alpha; routing to the first created"
    ]


def test_a_spec_is_parsed_once_per_generation() -> None:
    specs = Specs()
    first = service("llama", UNIFIED, uid="u1", generation=1)
    assert "llama" in snapshot([first], [], specs=specs)
    # Same uid and generation: the parsed spec is kept (this spec would be refused).
    same = service("llama", {"model": {"name": "x"}, "topology": {"mode": "Hybrid"}},
                   uid="u1", generation=1)  # fmt: skip
    assert "llama" in snapshot([same], [], specs=specs)
    problems: list[str] = []
    edited = {**same, "metadata": {**same["metadata"], "generation": 2}}
    assert snapshot([edited], [], problems, specs) == {}
    assert problems[0].startswith("skipping ns/llama: invalid spec")


def test_a_conflict_is_logged_when_it_appears_and_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    listed: list[dict[str, Any]] = [service("a", UNIFIED), service("b", UNIFIED)]
    discovery = KubeDiscovery(lambda: (listed, []))

    async def passes(count: int) -> None:
        for _ in range(count):
            await discovery.refresh()

    with caplog.at_level(logging.INFO, "llmfleet.gateway.discovery"):
        asyncio.run(passes(5))
        del listed[1]
        asyncio.run(passes(5))
    lines = [r.getMessage() for r in caplog.records if "served by ns/a and ns/b" in r.getMessage()]
    assert lines == [
        "model 'llama' is served by ns/a and ns/b; routing to the first created",
        "resolved: model 'llama' is served by ns/a and ns/b; routing to the first created",
    ]


class WatchedFake:
    """A lister with `changes`, as `WatchedLister` has: what the informers hold, and their
    change callback (called from another thread, as an informer's thread calls it)."""

    def __init__(self, services: list[dict[str, Any]]) -> None:
        self.services = services
        self.changes = Changes()
        self.calls = 0

    def __call__(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        self.calls += 1
        return list(self.services), []

    def change(self, obj: dict[str, Any]) -> None:
        self.services.append(obj)
        thread = threading.Thread(target=self.changes, args=(obj, None))
        thread.start()
        thread.join()


async def until(condition: Callable[[], bool], what: str, deadline_s: float = 10) -> float:
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < deadline_s, f"no {what} within {deadline_s}s"
        await asyncio.sleep(0.01)
    return time.monotonic() - started


def test_a_watched_snapshot_is_rebuilt_on_a_change_and_only_then() -> None:
    """Idle, nothing is rebuilt however many intervals pass (the cost follows changes, not
    fleet size x time); a change is served after a wake-up, not after the next interval."""
    lister = WatchedFake([service("a", UNIFIED)])
    discovery = KubeDiscovery(lister, interval=0.05)

    async def scenario() -> None:
        await discovery.start()
        await until(lambda: discovery.refreshes == 1, "first snapshot")
        first = discovery.services()
        await asyncio.sleep(0.5)  # ten intervals with no change
        assert (discovery.refreshes, lister.calls) == (1, 1)
        assert discovery.services() is first
        lister.change(service("b", {**UNIFIED, "model": {"name": "org/b", "servedName": "b"}}))
        await until(lambda: "b" in discovery.services(), "rebuild after the change")
        assert discovery.refreshes == 2
        await discovery.stop()

    asyncio.run(scenario())


def test_a_change_is_served_without_waiting_for_the_interval() -> None:
    lister = WatchedFake([service("a", UNIFIED)])
    discovery = KubeDiscovery(lister, interval=3600)  # only a wake-up can rebuild it

    async def scenario() -> None:
        await discovery.start()
        await until(lambda: discovery.refreshes == 1, "first snapshot")
        lister.change(service("b", {**UNIFIED, "model": {"name": "org/b", "servedName": "b"}}))
        await until(lambda: "b" in discovery.services(), "rebuild after the change")
        await discovery.stop()

    asyncio.run(scenario())


def test_a_static_lister_is_reread_every_interval() -> None:
    calls = 0

    def lister() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        nonlocal calls
        calls += 1
        return [service("a", UNIFIED)], []

    discovery = KubeDiscovery(lister, interval=0.01)

    async def scenario() -> None:
        await discovery.start()
        await until(lambda: calls >= 3, "three passes")
        await discovery.stop()

    asyncio.run(scenario())


def test_stop_ends_a_loop_that_lost_a_cancel() -> None:
    """Python 3.11's `wait_for` can swallow a cancel (gh-86296) and the loop runs on: `stop`
    cancels again until it ends, where awaiting the task once hung (a CI run hung there)."""
    discovery = KubeDiscovery(lambda: ([], []), interval=0.05)

    async def loses_one_cancel() -> None:
        lost = False
        while True:
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                if lost:
                    raise
                lost = True  # as `wait_for` does when its wake-up lands with the cancel

    async def scenario() -> None:
        loop = discovery._task = asyncio.create_task(loses_one_cancel())
        await asyncio.sleep(0.05)
        stopping = asyncio.create_task(discovery.stop())
        await asyncio.wait({stopping}, timeout=5)  # no cancel on timeout: a hang stays one
        ended = stopping.done()
        for task in (stopping, loop, loop):  # let a failed run end
            task.cancel()
            await asyncio.sleep(0.02)
        assert ended, "stop() still waits on a loop that lost a cancel"
        assert loop.cancelled()

    asyncio.run(scenario())


def _as_the_api_server_sends(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    """`obj` with what the API server adds and discovery never reads."""
    whole = {"apiVersion": "v1", "kind": kind, **obj}
    whole["metadata"] = {**obj["metadata"], "uid": "u-1", "resourceVersion": "7",
                         "creationTimestamp": "2026-11-28T00:00:00Z", "generation": 1,
                         "managedFields": [{"manager": "m", "fieldsV1": {"f:spec": {}}}],
                         "annotations": {"a": "b"}}  # fmt: skip
    return whole


def test_what_discovery_keeps_of_whole_objects_gives_their_snapshot() -> None:
    """Whole objects, as the API server sends them (a canary under way, endpoints with
    targetRefs, nodes, zones and hints), and what the informers keep of them: one snapshot."""
    status = {"revision": "abc", "observedGeneration": 1, "conditions": [{"type": "Ready"}],
              "canary": {"phase": "Progressing", "weight": 20, "revision": "def"}}  # fmt: skip
    services = [{**_as_the_api_server_sends(service("llama", UNIFIED), "InferenceService"),
                 "status": status}]  # fmt: skip
    slices = []
    canary_pool = L.revision_child_name("llama", "unified", "def")
    for name, ip in (("llama-unified", "10.0.0.1"), (canary_pool, "10.0.0.2")):
        serving = endpoint_slice(name, (ip, True, False), ("10.0.0.3", False, False))
        whole = _as_the_api_server_sends(serving, "EndpointSlice")
        whole["addressType"] = "IPv4"
        whole["ports"] = [{"name": "metrics", "port": 9090}, {"name": "http", "port": 8000}]
        for endpoint in whole["endpoints"]:
            endpoint.update(nodeName="n1", zone="z", hints={"forZones": [{"name": "z"}]},
                            targetRef={"kind": "Pod", "name": "p", "uid": "x"})  # fmt: skip
            endpoint["conditions"]["serving"] = True
        slices.append(whole)
    kept_services = [kept_service(o) for o in services]
    kept_slices = [kept_slice(o) for o in slices]
    assert snapshot(kept_services, kept_slices) == snapshot(services, slices)
    llama = snapshot(services, slices)["llama"]
    assert llama.canary is not None  # the case reads the canary's status and pools
    assert llama.pools["unified"].endpoints == ("http://10.0.0.1:8000",)
    assert "managedFields" not in kept_services[0]["metadata"]
    assert kept_services[0]["status"] == {"revision": "abc", "canary": status["canary"]}
    assert kept_slices[0]["endpoints"][0] == {
        "addresses": ["10.0.0.1"],
        "conditions": {"ready": True, "terminating": False},
    }
    assert kept_slices[0]["metadata"] == {
        "namespace": "ns",
        "resourceVersion": "7",
        "labels": {"kubernetes.io/service-name": "llama-unified"},
    }
    assert llama.canary.service.pools["unified"].endpoints == ("http://10.0.0.2:8000",)


def _fleet(count: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    services = [
        service(f"s{i}", {**UNIFIED, "model": {"name": "org/x", "servedName": f"m{i}"}},
                uid=f"u{i}", generation=1)
        for i in range(count)
    ]  # fmt: skip
    slices = [
        endpoint_slice(f"s{i}-unified", *[(f"10.0.{i}.{j}", True, False) for j in range(3)])
        for i in range(count)
    ]
    return services, slices


def test_a_rebuild_after_one_change_makes_only_that_service_anew() -> None:
    """`Built`: the services whose objects did not change are the same objects as before (and
    the diff of the two snapshots names only the changed one); the changed one is rebuilt."""
    services, slices = _fleet(50)
    built, specs = Built(), Specs()
    before = snapshot(services, slices, specs=specs, built=built)
    slices[7] = endpoint_slice("s7-unified", ("10.0.7.0", True, False))
    after = snapshot(services, slices, specs=specs, built=built)
    assert [m for m in after if after[m] is not before[m]] == ["m7"]
    assert after["m7"].pools["unified"].endpoints == ("http://10.0.7.0:8000",)
    assert changes(before, after) == [
        "model 'm7' (ns/s7) pool unified: serving endpoints http://10.0.7.0:8000"
    ]
    assert snapshot(services, slices, specs=specs, built=built) == after


Objects = tuple[list[dict[str, Any]], list[dict[str, Any]]]


def random_walk(seed: int, steps: int) -> Iterator[tuple[int, Objects]]:
    """A fleet of 12 through `steps` random changes (endpoints ready or not, slices split and
    removed, services added, deleted, edited, a canary started, reweighted and ended, a
    topology switched, a model name claimed twice), as informers hold it: an object changed is
    a new object, one unchanged is the same."""
    draw = random.Random(seed)
    services, slices = _fleet(12)
    for step in range(steps):
        index = draw.randrange(len(services) + 2)
        name = f"s{index}"
        match draw.randrange(6):
            case 0:  # the endpoints of one of its pools' slices
                pool = draw.choice(("unified", "prefill", "decode", f"u{'c' * 6}"))
                kept = [s for s in slices if s["metadata"]["labels"]["kubernetes.io/service-name"]
                        != f"{name}-{pool}"]  # fmt: skip
                for part in range(draw.randrange(3)):
                    ips = [f"10.1.{index}.{part * 10 + j}" for j in range(draw.randrange(4))]
                    endpoints = [(ip, draw.random() < 0.7, draw.random() < 0.1) for ip in ips]
                    kept.append(endpoint_slice(f"{name}-{pool}", *endpoints))
                slices = kept
            case 1:  # the service edited: a new generation, maybe another topology or model
                spec = draw.choice((UNIFIED, PD))
                served = draw.choice((f"m{index}", "m0", "shared"))
                spec = {**spec, "model": {"name": "org/x", "servedName": served}}
                services = [s for s in services if s["metadata"]["name"] != name]
                created = f"2026-11-{1 + index % 20:02d}"
                services.append(service(name, spec, uid=f"u{index}", generation=step + 2,
                                        creationTimestamp=created))  # fmt: skip
            case 2:  # its status: a canary runs, changes weight, or ends
                for position, obj in enumerate(services):
                    if obj["metadata"]["name"] == name:
                        canary = draw.choice((
                            None,
                            {"phase": "Progressing", "revision": "c" * 6,
                             "weight": draw.randrange(100)},
                            {"phase": "Promoted", "revision": "c" * 6},
                        ))  # fmt: skip
                        status = {"revision": "r1", **({"canary": canary} if canary else {})}
                        services[position] = {**obj, "status": status}
            case 3:  # deleted, or being deleted
                services = [s for s in services if s["metadata"]["name"] != name]
                if draw.random() < 0.5:
                    services.append(service(name, UNIFIED, uid=f"u{index}", generation=1,
                                            deletionTimestamp="2026-11-28T00:00:00Z"))  # fmt: skip
            case _:  # nothing: a rebuild with no change
                pass
        yield step, (services, slices)


def test_a_snapshot_from_what_was_built_is_the_snapshot_from_scratch() -> None:
    """Each snapshot of a random walk built with `Built` equals one built from nothing."""
    seen = {"canaries": 0, "endpoints": 0, "disaggregated": 0}
    built, specs = Built(), Specs()
    for step, (services, slices) in random_walk(11, 300):
        whole = snapshot(services, slices)
        assert snapshot(services, slices, [], specs, built) == whole, step
        seen["canaries"] += sum(s.canary is not None for s in whole.values())
        seen["endpoints"] += sum(len(p.endpoints) for s in whole.values() for p in s.pools.values())
        seen["disaggregated"] += sum("decode" in s.pools for s in whole.values())
    assert min(seen.values()) > 20, seen  # the walk went through each kind of state
