"""Ready means serving, and the GPU budget holds at run time: tables over the pure plan."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from llmfleet.crds import InferenceService
from llmfleet.crds.inference_service import AutoscalingStatus
from llmfleet.operator.budget import PoolTarget, fit, surge
from llmfleet.operator.observed import Observed, ObservedPod
from llmfleet.operator.plan import Plan, desired
from llmfleet.operator.pools import (
    COST_DRAINING,
    COST_SERVING,
    ENDPOINT_PROPAGATION_SECONDS,
    draining,
)
from tests.operator.test_plan import SETTINGS, load

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def service(sample: str = "unified", **changes: Any) -> InferenceService:
    """A sample with `changes`: `path__to__field=value` under spec."""
    manifest = load(sample).model_dump(by_alias=True, exclude_none=True)
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        node = manifest["spec"]
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return InferenceService.model_validate(manifest)


def pod(name: str, pool: str = "unified", *, serving: bool = True, ready: bool = True,
        **extra: Any) -> ObservedPod:  # fmt: skip
    return ObservedPod(
        name=name, pool=pool, created=NOW - timedelta(minutes=5), ready=ready, serving=serving,
        deletion_cost=COST_SERVING if serving else None, **extra,
    )  # fmt: skip


def conditions(plan: Plan) -> dict[str, dict[str, Any]]:
    status: Any = plan.status
    return {condition["type"]: condition for condition in status["conditions"]}


@dataclass(frozen=True)
class ReadyRow:
    id: str
    service: InferenceService
    pods: list[ObservedPod]
    status: str
    reason: str
    said: list[str] = field(default_factory=list)
    autoscaling: dict[str, Any] | None = None


READY = [
    ReadyRow("every-pool-serves-its-target", service(),
             [pod("a"), pod("b")], "True", "Serving", ["unified 2/2 serving"]),
    ReadyRow("replicas-zero-is-not-ready", service(topology__unified__replicas=0),
             [], "False", "ScaledToZero", ["spec.topology.unified.replicas is 0",
                                           "Set replicas to 1 or more"]),
    ReadyRow("a-zero-pool-of-two-is-not-ready", service("disaggregated",
             topology__decode__replicas=0, topology__decode__minReplicas=0),
             [pod("p", "prefill")], "False", "ScaledToZero", ["no pod serves in decode"]),
    ReadyRow("autoscaler-chose-zero",
             service(topology__unified__minReplicas=0, autoscaling__enabled=True),
             [], "False", "ScaledToZero", ["the autoscaler's decision"],
             autoscaling={"pools": {"unified": {"active": 0}}}),
    ReadyRow("all-pods-gone", service(), [], "False", "NoServingReplicas",
             ["No pod serves in unified", "0 pod(s) starting"]),
    ReadyRow("only-starting-pods", service(),
             [pod("a", serving=False, ready=False), pod("b", serving=False, ready=False)],
             "False", "NoServingReplicas", ["2 pod(s) starting"]),
    ReadyRow("one-of-two-pools-has-none", service("disaggregated"),
             [pod("p", "prefill")], "False", "NoServingReplicas", ["No pod serves in decode"]),
    ReadyRow("serving-below-target", service(), [pod("a"), pod("b", serving=False, ready=False)],
             "False", "PodsStarting", ["unified 1/2 serving"]),
]  # fmt: skip


@pytest.mark.parametrize("row", READY, ids=lambda row: row.id)
def test_ready_means_serving(row: ReadyRow) -> None:
    decided = AutoscalingStatus.model_validate(row.autoscaling) if row.autoscaling else None
    observed = Observed(pods=tuple(row.pods), autoscaling=decided)
    plan = desired(row.service, observed, SETTINGS, NOW)
    ready = conditions(plan)["Ready"]
    print(f"Ready={ready['status']} {ready['reason']}: {ready['message']}")
    assert (ready["status"], ready["reason"]) == (row.status, row.reason)
    for words in row.said:
        assert words in ready["message"]
    assert conditions(plan)["Degraded"]["status"] == "False", "serving less is no problem"


def target(active: int, spares: int, draining: int = 0) -> PoolTarget:
    return PoolTarget(active, spares, "spec", active, spares, draining)


@pytest.mark.parametrize(
    ("wanted", "gpus", "budget", "fitted"),
    [
        pytest.param({"unified": (2, 1)}, 1, None, {"unified": (2, 1)}, id="no-budget"),
        pytest.param({"unified": (2, 1)}, 1, 3, {"unified": (2, 1)}, id="exactly-the-budget"),
        pytest.param({"unified": (2, 2)}, 1, 3, {"unified": (2, 1)}, id="spares-go-first"),
        pytest.param({"unified": (4, 1)}, 2, 6, {"unified": (3, 0)}, id="then-active-pods"),
        pytest.param({"prefill": (1, 2), "decode": (3, 1)}, 1, 5, {"prefill": (1, 0),
                     "decode": (3, 1)}, id="spares-from-the-pool-with-most-first-on-a-tie"),
        pytest.param({"prefill": (2, 0), "decode": (4, 0)}, 1, 4, {"prefill": (2, 0),
                     "decode": (2, 0)}, id="active-from-the-pool-with-most"),
        pytest.param({"unified": (2, 1, 1)}, 1, 3, {"unified": (2, 0)},
                     id="draining-pods-hold-their-gpus"),
    ],
)  # fmt: skip
def test_the_budget_cuts_spares_then_active_pods(
    wanted: dict[str, tuple[int, ...]],
    gpus: int,
    budget: int | None,
    fitted: dict[str, tuple[int, int]],
) -> None:
    result = fit({pool: target(*counts) for pool, counts in wanted.items()}, gpus, budget)
    assert {pool: (t.active, t.spares) for pool, t in result.items()} == fitted


def draining_pod(name: str) -> ObservedPod:
    return ObservedPod(
        name=name, pool="unified", created=NOW - timedelta(minutes=5), ready=True, serving=False,
        demoted_at=NOW - timedelta(seconds=1), deletion_cost=COST_DRAINING, in_flight=2,
    )  # fmt: skip


@dataclass(frozen=True)
class BudgetRow:
    id: str
    spec: dict[str, Any]
    replicas: int
    """The Deployment's."""
    limited: str
    """ScalingLimited's status."""
    said: list[str]
    decision: dict[str, int] | None = None
    pods: list[ObservedPod] = field(default_factory=list)


BUDGET = [
    BudgetRow("warm-spares-beyond-the-budget",
              {"autoscaling__warmSpares": 2, "autoscaling__gpuBudget": 3}, 3, "True",
              ["GPU budget 3 (1 GPU per pod): the pools would need 4 GPUs and hold 3.",
               "unified runs 2 active + 1 spare of 2 + 2 wanted (spec)"]),
    BudgetRow("autoscaler-decision-beyond-the-budget",
              {"autoscaling__enabled": True, "autoscaling__gpuBudget": 3,
               "topology__unified__maxReplicas": 8}, 3, "True",
              ["unified runs 3 active + 0 spare of 6 + 1 wanted (autoscaler)"],
              decision={"active": 6, "spares": 1}),
    BudgetRow("no-spare-backfilled-while-a-pod-drains",
              {"autoscaling__warmSpares": 1, "autoscaling__gpuBudget": 3}, 3, "True",
              ["unified runs 2 active + 0 spare (+ 1 draining)"],
              pods=[pod("a"), pod("b"), draining_pod("c")]),
    BudgetRow("within-the-budget", {"autoscaling__gpuBudget": 4}, 2, "False",
              ["The pools hold 2 of the GPU budget's 4 GPUs."]),
    # Back to Unified while the old prefill and decode pods still serve: they hold 2 GPUs.
    BudgetRow("a-topology-change-starts-the-new-pool-within-what-is-left",
              {"topology__unified__replicas": 1, "autoscaling__warmSpares": 1,
               "autoscaling__gpuBudget": 3}, 1, "True",
              ["the pools would need 4 GPUs and hold 3", "unified runs 1 active + 0 spare",
               "2 pod(s) of pools the spec no longer has hold their GPUs"],
              pods=[pod("p", "prefill"), pod("d", "decode")]),
    BudgetRow("no-room-for-the-new-pool-until-the-old-ones-go",
              {"topology__unified__replicas": 1, "autoscaling__gpuBudget": 2}, 0, "True",
              ["unified runs 0 active + 0 spare of 1 + 0 wanted"],
              pods=[pod("p", "prefill"), pod("d", "decode")]),
    BudgetRow("retiring-pods-within-the-budget",
              {"topology__unified__replicas": 1, "autoscaling__gpuBudget": 4}, 1, "False",
              ["The pools hold 3 of the GPU budget's 4 GPUs."],
              pods=[pod("p", "prefill"), pod("d", "decode"), pod("u", serving=False)]),
]  # fmt: skip


@pytest.mark.parametrize("row", BUDGET, ids=lambda row: row.id)
def test_the_operator_never_runs_more_than_the_budget(row: BudgetRow) -> None:
    decided = (
        AutoscalingStatus.model_validate({"pools": {"unified": row.decision}})
        if row.decision
        else None
    )
    observed = Observed(pods=tuple(row.pods), autoscaling=decided)
    plan = desired(service(**row.spec), observed, SETTINGS, NOW)
    [deployment] = [o for o in plan.objects if o["kind"] == "Deployment"]
    assert deployment["spec"]["replicas"] == row.replicas
    limited = conditions(plan)["ScalingLimited"]
    print(f"ScalingLimited={limited['status']} {limited['reason']}: {limited['message']}")
    assert limited["status"] == row.limited
    for words in row.said:
        assert words in limited["message"]
    if row.limited == "True":
        assert limited["reason"] == "GPUBudget"
        assert any(e.reason == "GPUBudget" and e.warning for e in plan.events)


@pytest.mark.parametrize(
    ("pods", "pools", "budget", "extra"),
    [
        pytest.param(2, 1, None, 1, id="no-budget-surges"),
        pytest.param(2, 1, 3, 1, id="room-for-one-more"),
        pytest.param(3, 1, 3, 0, id="at-the-budget-no-surge"),
        pytest.param(3, 2, 4, 0, id="room-for-one-but-two-pools-roll"),
    ],
)  # fmt: skip
def test_rollouts_surge_only_within_the_budget(
    pods: int, pools: int, budget: int | None, extra: int
) -> None:
    assert surge(pods, pools, 1, budget) == extra


def test_a_deployment_at_the_budget_rolls_one_pod_down_at_a_time() -> None:
    at_budget = service(autoscaling__gpuBudget=2)  # 2 replicas of 1 GPU
    plan = desired(at_budget, Observed(), SETTINGS, NOW)
    [deployment] = [o for o in plan.objects if o["kind"] == "Deployment"]
    rolling = deployment["spec"]["strategy"]["rollingUpdate"]
    assert rolling == {"maxSurge": 0, "maxUnavailable": 1}


@pytest.mark.parametrize(
    ("demoted_ago", "in_flight", "drain_seconds", "still"),
    [
        pytest.param(1.0, 0, 120, True, id="idle-but-routers-may-not-know-yet"),
        pytest.param(ENDPOINT_PROPAGATION_SECONDS + 1, 0, 120, False, id="idle-and-known"),
        pytest.param(ENDPOINT_PROPAGATION_SECONDS + 1, 3, 120, True, id="busy"),
        pytest.param(ENDPOINT_PROPAGATION_SECONDS + 1, None, 120, True, id="unknown"),
        pytest.param(121.0, 3, 120, False, id="drain-period-over"),
        pytest.param(1.0, 3, 0, False, id="no-drain-at-all"),
        pytest.param(1.0, 0, 2, True, id="short-drain"),
        pytest.param(2.5, 0, 2, False, id="short-drain-over"),
    ],
)  # fmt: skip
def test_a_demoted_pod_drains_at_least_while_routers_catch_up(
    demoted_ago: float, in_flight: int | None, drain_seconds: float, still: bool
) -> None:
    """Even with nothing in flight a demoted pod stays a few seconds: the gateway (and any
    router reading EndpointSlices) may route to it until it has seen it go."""
    pod = ObservedPod(
        name="a", pool="unified", created=NOW - timedelta(minutes=5), ready=True, serving=False,
        demoted_at=NOW - timedelta(seconds=demoted_ago), in_flight=in_flight,
    )  # fmt: skip
    assert draining(pod, NOW, drain_seconds) is still
