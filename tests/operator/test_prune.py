"""Pruning as tables: what the plan deletes, drains or keeps of a service's observed children."""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from llmfleet.crds import InferenceService
from llmfleet.crds import labels as L
from llmfleet.operator.observed import Observed, ObservedChild, ObservedPod
from llmfleet.operator.plan import desired
from llmfleet.operator.pools import COST_SERVING
from tests.operator.test_plan import SETTINGS, load

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
UID = "uid-1"
OURS = {L.SERVICE: "llama-8b", L.MANAGED_BY: L.MANAGED_BY_VALUE}
KINDS = {
    "Deployment": "apps/v1",
    "Service": "v1",
    "ConfigMap": "v1",
    "PodDisruptionBudget": "policy/v1",
    "ServiceMonitor": "monitoring.coreos.com/v1",
}


def child(
    kind: str,
    name: str,
    pool: str | None = None,
    *,
    owner: str | None = UID,
    labels: dict[str, str] | None = None,
) -> ObservedChild:
    found = dict(OURS if labels is None else labels)
    if pool:
        found[L.POOL] = pool
    return ObservedChild(
        api_version=KINDS[kind], kind=kind, namespace="team", name=name, uid=f"uid-{name}",
        labels=found, controller_uid=owner,
    )  # fmt: skip


def pool_children(service: str, pool: str) -> list[ObservedChild]:
    name = f"{service}-{pool}"
    return [child(kind, name, pool) for kind in ("Deployment", "Service", "PodDisruptionBudget")]


SHARED = [child("ConfigMap", "llama-8b-runtime"), child("Service", "llama-8b-metrics")]
UNIFIED = SHARED + pool_children("llama-8b", "unified")
DISAGGREGATED = SHARED + pool_children("llama-8b", "prefill") + pool_children("llama-8b", "decode")


def pod(
    name: str, pool: str, *, serving: bool = True, ready: bool = True, **extra: Any
) -> ObservedPod:
    return ObservedPod(
        name=name, pool=pool, created=NOW - timedelta(minutes=5), ready=ready, serving=serving,
        deletion_cost=COST_SERVING if serving else None, **extra,
    )  # fmt: skip


def disaggregated() -> InferenceService:
    """The unified sample (llama-8b, 2 replicas) switched to Disaggregated, one pod per pool."""
    manifest = load("unified").model_dump(by_alias=True, exclude_none=True)
    manifest["spec"]["topology"] = {
        "mode": "Disaggregated", "prefill": {"replicas": 1}, "decode": {"replicas": 1},
        "kvTransfer": {"connector": "NixlConnector"},
    }  # fmt: skip
    return InferenceService.model_validate(manifest)


def endpoints(pods: list[ObservedPod]) -> dict[str, int]:
    """What the EndpointSlices say once they caught up with the pods' labels."""
    return dict(Counter(pod.pool for pod in pods if pod.serving and pod.ready))


@dataclass(frozen=True)
class Row:
    id: str
    service: InferenceService
    children: list[ObservedChild]
    pods: list[ObservedPod] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    demoted: list[str] = field(default_factory=list)
    progressing: str = "Stable"


P_D_SERVE = [pod("prefill-0", "prefill"), pod("decode-0", "decode")]
UNIFIED_SERVE = [pod("unified-0", "unified"), pod("unified-1", "unified")]
OLD_UNIFIED = ["Deployment/llama-8b-unified", "PodDisruptionBudget/llama-8b-unified",
               "Service/llama-8b-unified"]  # fmt: skip

ROWS = [
    Row("steady-state-nothing-to-prune", load("unified"), UNIFIED, UNIFIED_SERVE),
    Row("switched-old-pool-serves-until-the-new-pools-serve", disaggregated(),
        UNIFIED + pool_children("llama-8b", "prefill") + pool_children("llama-8b", "decode"),
        [*UNIFIED_SERVE, pod("prefill-0", "prefill", serving=False, ready=False)],
        progressing="Scaling"),
    Row("new-pools-serve-old-pool-is-demoted-not-yet-deleted", disaggregated(),
        UNIFIED + pool_children("llama-8b", "prefill") + pool_children("llama-8b", "decode"),
        UNIFIED_SERVE + P_D_SERVE, demoted=["unified-0", "unified-1"],
        progressing="RemovingPools"),
    Row("old-pool-still-draining-is-kept", disaggregated(),
        DISAGGREGATED + pool_children("llama-8b", "unified"),
        [*P_D_SERVE, pod("unified-0", "unified", serving=False,
                         demoted_at=NOW - timedelta(seconds=1), in_flight=3)],
        progressing="RemovingPools"),
    Row("old-pool-drained-is-deleted", disaggregated(),
        DISAGGREGATED + pool_children("llama-8b", "unified"),
        [*P_D_SERVE, pod("unified-0", "unified", serving=False,
                         demoted_at=NOW - timedelta(seconds=5), in_flight=0)],
        deleted=OLD_UNIFIED, progressing="RemovingPools"),
    Row("old-pool-without-pods-is-deleted-at-once", disaggregated(),
        DISAGGREGATED + pool_children("llama-8b", "unified"), P_D_SERVE, deleted=OLD_UNIFIED,
        progressing="RemovingPools"),
    Row("back-to-unified-removes-prefill-and-decode", load("unified"),
        UNIFIED + pool_children("llama-8b", "prefill") + pool_children("llama-8b", "decode"),
        UNIFIED_SERVE, progressing="RemovingPools",
        deleted=sorted(f"{kind}/llama-8b-{pool}" for pool in ("prefill", "decode")
                       for kind in ("Deployment", "PodDisruptionBudget", "Service"))),
    Row("unwanted-child-without-a-pool-goes-at-once", load("unified"),
        [*UNIFIED, child("ServiceMonitor", "llama-8b-metrics")], UNIFIED_SERVE,
        deleted=["ServiceMonitor/llama-8b-metrics"]),
    Row("look-alike-without-owner-reference-survives", load("unified"),
        [*UNIFIED, child("Deployment", "llama-8b-copy", "unified", owner=None)], UNIFIED_SERVE),
    Row("owned-by-another-service-survives", load("unified"),
        [*UNIFIED, child("Deployment", "llama-8b-prefill", "prefill", owner="uid-other")],
        UNIFIED_SERVE),
    Row("owned-but-not-labelled-by-the-operator-survives", load("unified"),
        [*UNIFIED, child("Deployment", "llama-8b-extra", "prefill",
                         labels={L.SERVICE: "llama-8b"})], UNIFIED_SERVE),
    Row("labelled-for-another-service-survives", load("unified"),
        [*UNIFIED, child("Deployment", "other-prefill", "prefill",
                         labels={L.SERVICE: "other", L.MANAGED_BY: L.MANAGED_BY_VALUE})],
        UNIFIED_SERVE),
]  # fmt: skip


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.id)
def test_pruning(row: Row) -> None:
    service = row.service.model_copy(deep=True)
    service.metadata.update(namespace="team", uid=UID)
    observed = Observed(
        pods=tuple(row.pods), children=tuple(row.children), ready_endpoints=endpoints(row.pods)
    )
    plan = desired(service, observed, SETTINGS, NOW)
    assert sorted(f"{c.kind}/{c.name}" for c in plan.deletions) == sorted(row.deleted)
    demoted = [c.name for c in plan.pod_changes if not c.serving and c.demoted_at == NOW]
    assert sorted(demoted) == row.demoted
    status: Any = plan.status
    progressing = next(c for c in status["conditions"] if c["type"] == "Progressing")
    print(f"Progressing={progressing['status']} {progressing['reason']}: {progressing['message']}")
    assert progressing["reason"] == row.progressing
    if row.progressing == "RemovingPools":
        assert plan.requeue_after is not None


def test_an_old_pool_drains_only_once_the_endpoint_slices_list_the_new_pools() -> None:
    """Pod labels say serving a moment before the EndpointSlices (and the gateway) do."""
    service = disaggregated()
    service.metadata.update(namespace="team", uid=UID)
    children = UNIFIED + pool_children("llama-8b", "prefill") + pool_children("llama-8b", "decode")
    pods = (*UNIFIED_SERVE, *P_D_SERVE)
    lagging, caught_up = {"unified": 2, "prefill": 1}, {"unified": 2, "prefill": 1, "decode": 1}
    for slices, demoted in ((lagging, []), (caught_up, ["unified-0", "unified-1"])):
        observed = Observed(pods=pods, children=tuple(children), ready_endpoints=slices)
        plan = desired(service, observed, SETTINGS, NOW)
        assert sorted(c.name for c in plan.pod_changes if c.demoted_at == NOW) == demoted


def test_an_old_pool_is_pruned_once_the_new_pools_cannot_get_gpus() -> None:
    """Make-before-break needs room for both; when the new pools' pods wait for GPUs (which the
    old pool may hold), the old pool drains anyway."""
    service = disaggregated()
    service.metadata.update(namespace="team", uid=UID)
    scheduler = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    pending = pod("prefill-0", "prefill", serving=False, ready=False, unschedulable=scheduler)
    observed = Observed(
        pods=(*UNIFIED_SERVE, pending),
        children=tuple(UNIFIED + pool_children("llama-8b", "prefill")),
    )
    plan = desired(service, observed, SETTINGS, NOW)
    assert sorted(c.name for c in plan.pod_changes if c.demoted_at == NOW) == [
        "unified-0",
        "unified-1",
    ]


def test_the_runtime_config_keeps_a_retiring_pools_config_until_its_children_go() -> None:
    """An engine of the old pool that restarts mid-change still finds its config file; the file
    goes with the pool's last child. A config of a pool nobody retires is not kept."""
    service = disaggregated()
    service.metadata.update(namespace="team", uid=UID)
    old = {"unified.json": '{"old": true}', "stray.json": "{}", "decode.json": "stale"}
    runtime = dataclasses.replace(child("ConfigMap", "llama-8b-runtime"), data=old)
    others = [c for c in UNIFIED if c.kind != "ConfigMap"]
    for children, kept in ((others, True), (SHARED[1:], False)):
        observed = Observed(pods=UNIFIED_SERVE, children=(runtime, *children))
        [config] = [o for o in desired(service, observed, SETTINGS, NOW).objects
                    if o["kind"] == "ConfigMap"]  # fmt: skip
        wanted = {"prefill.json", "decode.json"} | ({"unified.json"} if kept else set())
        assert set(config["data"]) == wanted
        assert config["data"]["decode.json"] != "stale"
        if kept:
            assert config["data"]["unified.json"] == '{"old": true}'
