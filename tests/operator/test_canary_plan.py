"""Canary rollouts through the pure plan, pass after pass on an in-memory cluster (`world.py`):
the Deployments per revision, their sizes and labels, promotion, rollback and the budget."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from llmfleet.crds import InferenceService
from llmfleet.crds import labels as L
from llmfleet.crds.inference_service import CanaryStatus
from llmfleet.operator.budget import PoolTarget
from llmfleet.operator.canary_plan import split
from llmfleet.operator.plan import Plan
from llmfleet.operator.rollout import Analysis, Verdict, analysis_due
from llmfleet.operator.settings import OperatorSettings
from tests.operator.world import World

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
SETTINGS = OperatorSettings(drain_seconds=30, network_policy=False)
PASS = Analysis(Verdict.PASS, "canary 80 requests, 0 errors; stable 240 requests, 0 errors")
FAIL = Analysis(
    Verdict.FAIL,
    "last 10s: canary ...; stable ...",
    "ITL p95 of the canary 99.0 ms exceeds 1.5 x the stable revision's 24.2 ms",
)
STEPS = [{"weight": 25, "pauseSeconds": 20}, {"weight": 100, "pauseSeconds": 10}]


def chat(
    value: str = "1",
    *,
    strategy: str = "Canary",
    replicas: int = 4,
    spares: int = 0,
    budget: int | None = None,
    annotations: dict[str, str] | None = None,
    topology: dict[str, Any] | None = None,
    name: str = "chat",
    deadline: int = 1800,
) -> InferenceService:
    """A service whose engine env `V` is `value` (a new value is a new revision)."""
    autoscaling: dict[str, Any] = {"warmSpares": spares}
    if budget is not None:
        autoscaling["gpuBudget"] = budget
    return InferenceService.model_validate({
        "metadata": {"name": name, "namespace": "team", "uid": "uid-1", "generation": 1,
                     "annotations": annotations or {}},
        "spec": {
            "model": {"name": "m"},
            "runtime": {"env": [{"name": "V", "value": value}]},
            "topology": topology or {"unified": {"replicas": replicas}},
            "autoscaling": autoscaling,
            "rollout": {"strategy": strategy, "steps": STEPS,
                        "analysis": {"intervalSeconds": 10},
                        "progressDeadlineSeconds": deadline},
        },
    })  # fmt: skip


def canary_of(world: World) -> CanaryStatus | None:
    raw = world.status.get("canary")
    return CanaryStatus.model_validate(raw) if raw else None


def settle(world: World, passes: int = 8) -> None:
    for _ in range(passes):
        world.step()


def run(world: World, verdict: Analysis, until: str, passes: int = 120) -> list[Plan]:
    """Passes (an analysis with `verdict` whenever one is due) until the canary is `until`
    and nothing drains any more."""
    plans = []
    for _ in range(passes):
        due = analysis_due(canary_of(world), world.service.spec.rollout, world.now)
        plans.append(world.step(verdict if due else None))
        canary = canary_of(world)
        if canary is not None and canary.phase == until and not plans[-1].rollout.role("retiring"):  # type: ignore[union-attr]
            return plans
    raise AssertionError(f"not {until} after {passes} passes: {world.status.get('canary')}")


def reasons(plans: list[Plan]) -> list[str]:
    return [event.reason for plan in plans for event in plan.events
            if event.reason.startswith("Canary")]  # fmt: skip


def test_a_new_service_records_its_revision_and_runs_as_before() -> None:
    world = World(chat(), SETTINGS, NOW)
    settle(world)
    assert world.serving("chat-unified") == 4
    assert len(world.status["revision"]) == 10
    # Unset optional fields are written as nulls (a merge patch then removes an older value).
    assert world.status["stableSpec"]["runtime"]["env"] == [
        {"name": "V", "value": "1", "valueFrom": None}
    ]
    assert world.status["stableSpec"]["deploymentRevision"] == ""
    assert "canary" not in world.status
    deployment = world.children[("Deployment", "chat-unified")]
    assert deployment["spec"]["selector"]["matchLabels"] == {L.SERVICE: "chat", L.POOL: "unified"}
    assert deployment["metadata"]["labels"][L.REVISION] == world.status["revision"]


def test_a_healthy_canary_walks_every_step_and_is_promoted() -> None:
    world = World(chat("1"), SETTINGS, NOW)
    settle(world)
    old = world.status["revision"]
    stable_template = world.children[("Deployment", "chat-unified")]["spec"]["template"]
    world.service = chat("2")
    plans = run(world, PASS, "Promoted")
    new = world.status["revision"]
    name = L.revision_child_name("chat", "unified", new)
    assert new != old
    assert reasons(plans) == ["CanaryStarted", "CanaryStep", "CanaryPromoting", "CanaryPromoted"]

    seen: list[tuple[str, int, int]] = []
    for plan in plans:
        canary = plan.status["canary"]
        assert isinstance(canary, dict)
        objects = {(o["kind"], o["metadata"]["name"]): o for o in plan.objects}
        if canary["phase"] in ("Progressing", "Promoting"):
            # The stable revision's Deployment is what it was: its pods never roll.
            assert objects[("Deployment", "chat-unified")]["spec"]["template"] == stable_template
            deployment = objects[("Deployment", name)]
            assert ("Service", name) in objects
            step = (canary["phase"], canary["weight"], deployment["spec"]["replicas"])
            if not seen or seen[-1] != step:
                seen.append(step)
    # 25% of 4 is one pod, 100% four; promoting runs the whole target.
    assert seen == [("Progressing", 25, 1), ("Progressing", 100, 4), ("Promoting", 100, 4)]

    # Promoted: the canary's Deployment is the stable one, its pods in the pool Service.
    assert world.status["stableSpec"]["deploymentRevision"] == new
    assert world.serving(name) == 4
    assert ("Deployment", "chat-unified") not in world.children
    assert ("Service", name) not in world.children
    assert world.children[("Service", "chat-unified")]["spec"]["selector"][L.SERVING] == "true"
    config = world.children[("ConfigMap", "chat-runtime")]["data"]
    assert f"{name.removeprefix('chat-')}.json" in config
    assert world.condition("CanaryInProgress")["status"] == "False"
    assert world.condition("Degraded")["status"] == "False"
    # The next passes change nothing: the promoted Deployment is applied as it was.
    template = world.children[("Deployment", name)]["spec"]["template"]
    settle(world, 3)
    assert world.children[("Deployment", name)]["spec"]["template"] == template
    assert world.history[-1].pod_changes == ()


def test_the_pool_service_never_loses_every_endpoint_during_a_rollout() -> None:
    world = World(chat("1", replicas=2), SETTINGS, NOW)
    settle(world)
    world.service = chat("2", replicas=2)
    for _ in range(80):
        due = analysis_due(canary_of(world), world.service.spec.rollout, world.now)
        world.step(PASS if due else None)
        stable = sum(1 for p in world.pods.values() if p.ready and p.serving_value == "true"
                     and p.serving)  # fmt: skip
        assert stable >= 1, world.status.get("canary")


def test_canary_pods_carry_their_revision_and_serve_only_in_the_canary_service() -> None:
    world = World(chat("1"), SETTINGS, NOW)
    settle(world)
    world.service = chat("2")
    settle(world, 6)
    canary = canary_of(world)
    assert canary is not None
    name = L.revision_child_name("chat", "unified", canary.revision)
    deployment = world.children[("Deployment", name)]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels[L.REVISION] == canary.revision
    assert labels[L.DEPLOYMENT] == name
    assert deployment["spec"]["selector"]["matchLabels"][L.DEPLOYMENT] == name
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][-1].endswith(f"/{name.removeprefix('chat-')}.json")
    assert {"name": "V", "value": "2"} in container["env"]
    selector = world.children[("Service", name)]["spec"]["selector"]
    assert selector == {L.SERVICE: "chat", L.POOL: "unified", L.DEPLOYMENT: name,
                        L.SERVING: L.SERVING_CANARY}  # fmt: skip
    assert world.serving(name, L.SERVING_CANARY) == 1
    assert world.serving("chat-unified") == 4
    # The stable pods keep their revision's env (on the pod: env never enters the ConfigMap),
    # and each Deployment reads its own config key.
    stable = world.children[("Deployment", "chat-unified")]["spec"]["template"]["spec"]
    assert {"name": "V", "value": "1"} in stable["containers"][0]["env"]
    data = world.children[("ConfigMap", "chat-runtime")]["data"]
    assert {"unified.json", f"{name.removeprefix('chat-')}.json"} <= set(data)
    assert all('"env"' not in text for text in data.values())
    assert world.status["serving"] == "unified 4/4 canary 1/1 (25%)"
    assert world.condition("CanaryInProgress")["status"] == "True"


def test_a_failing_canary_is_rolled_back_and_not_tried_again_until_asked() -> None:
    world = World(chat("1"), SETTINGS, NOW)
    settle(world)
    world.service = chat("2")
    plans = run(world, FAIL, "RolledBack")
    canary = canary_of(world)
    assert canary is not None
    name = L.revision_child_name("chat", "unified", canary.revision)
    assert (canary.weight, canary.failed_revision) == (0, canary.revision)
    # One warning event, not a second one for the condition.
    warnings = [e for plan in plans for e in plan.events if e.warning]
    assert [e.reason for e in warnings] == ["CanaryRolledBack"]
    assert "ITL p95 of the canary 99.0 ms" in warnings[0].message
    degraded = world.condition("Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "CanaryRolledBack")
    assert "24.2 ms" in degraded["message"]
    assert world.condition("Ready")["status"] == "True"
    # The canary's pods drained and its children are gone; the stable revision never moved.
    assert ("Deployment", name) not in world.children
    assert ("Service", name) not in world.children
    assert world.serving("chat-unified") == 4
    assert world.status["revision"] == canary.stable_revision

    later = [world.step() for _ in range(20)]
    assert "CanaryStarted" not in reasons(later)
    world.service = chat("2", annotations={L.ROLLOUT_RETRY: "2026-03-01T12:10:00Z"})
    assert reasons([world.step()]) == ["CanaryStarted"]
    assert world.condition("Degraded")["status"] == "False"


def test_a_canary_whose_pods_never_serve_is_rolled_back_at_its_progress_deadline() -> None:
    world = World(chat("1"), SETTINGS, NOW)
    settle(world)
    world.ready_after = 10**9  # the new revision's pods never turn Ready (a crash loop)
    world.service = chat("2", deadline=60)
    started = world.now
    plans = run(world, PASS, "RolledBack", passes=60)
    canary = canary_of(world)
    assert canary is not None
    assert 60 <= (world.now - started).total_seconds() <= 64  # passes are 2 s apart
    assert reasons(plans) == ["CanaryStarted", "CanaryProgressDeadlineExceeded"]
    degraded = world.condition("Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "CanaryProgressDeadlineExceeded")
    assert (
        "did not serve weight 25% within spec.rollout.progressDeadlineSeconds (60s"
        in (degraded["message"])
    )
    name = L.revision_child_name("chat", "unified", canary.revision)
    assert ("Deployment", name) not in world.children
    assert world.serving("chat-unified") == 4
    assert world.condition("Ready")["status"] == "True"


def test_a_newer_spec_after_a_rollback_starts_its_canary() -> None:
    world = World(chat("1"), SETTINGS, NOW)
    settle(world)
    world.service = chat("2")
    run(world, FAIL, "RolledBack")
    world.service = chat("3")
    assert reasons([world.step()]) == ["CanaryStarted"]
    canary = canary_of(world)
    assert canary is not None
    assert canary.failed_revision == ""


def test_abort_rolls_back_at_once_and_promote_skips_the_steps() -> None:
    world = World(chat("1"), SETTINGS, NOW)
    settle(world)
    world.service = chat("2")
    settle(world, 4)
    world.service = chat("2", annotations={L.ROLLOUT_ABORT: "now"})
    assert reasons([world.step()]) == ["CanaryAborted"]
    world.service = chat("3", annotations={L.ROLLOUT_ABORT: "now"})  # the old value: no abort
    settle(world, 4)
    world.service = chat("3", annotations={L.ROLLOUT_ABORT: "now", L.ROLLOUT_PROMOTE: "1"})
    plans = run(world, PASS, "Promoted", passes=40)
    assert reasons(plans)[:2] == ["CanaryPromoting", "CanaryPromoted"]


def test_rolling_update_replaces_the_pods_in_place() -> None:
    world = World(chat("1", strategy="RollingUpdate"), SETTINGS, NOW)
    settle(world)
    old = world.status["revision"]
    world.service = chat("2", strategy="RollingUpdate")
    plan = world.step()
    assert world.status["revision"] != old
    assert "canary" not in world.status
    names = sorted(o["metadata"]["name"] for o in plan.objects if o["kind"] == "Deployment")
    assert names == ["chat-unified"]
    env = plan.objects[-3]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "V", "value": "2"} in env


def test_a_disaggregated_canary_runs_in_both_pools() -> None:
    pd = {"mode": "Disaggregated", "prefill": {"replicas": 2}, "decode": {"replicas": 2},
          "kvTransfer": {"connector": "NixlConnector"}}  # fmt: skip
    world = World(chat("1", topology=pd), SETTINGS, NOW)
    settle(world)
    world.service = chat("2", topology=pd)
    settle(world, 6)
    canary = canary_of(world)
    assert canary is not None
    for pool in ("prefill", "decode"):
        name = L.revision_child_name("chat", pool, canary.revision)
        assert world.children[("Deployment", name)]["spec"]["replicas"] == 1
        assert ("Service", name) in world.children
        assert world.serving(name, L.SERVING_CANARY) == 1
    assert world.status["serving"] == "prefill 2/2 decode 2/2 canary prefill 1/1 decode 1/1 (25%)"


def test_children_of_a_canary_fit_the_name_limit() -> None:
    longest = "l" + "x" * (L.SERVICE_NAME_MAX_LENGTH - 1)
    world = World(chat("1", name=longest), SETTINGS, NOW)
    settle(world, 3)
    world.service = chat("2", name=longest)
    plan = world.step()
    names = {o["metadata"]["name"] for o in plan.objects}
    assert max(map(len, names)) <= L.DNS_LABEL_MAX_LENGTH
    assert any(name.startswith(f"{longest}-u") and len(name) == 63 for name in names)


def target(active: int, spares: int = 0, draining: int = 0) -> PoolTarget:
    return PoolTarget(active, spares, "spec", active, spares, draining)


@pytest.mark.parametrize(
    ("stable", "weight", "serving", "promoting", "budget", "expected"),
    [
        pytest.param({"unified": target(4)}, 25, {}, False, None,
                     ({"unified": (4, 0)}, {"unified": (1, 0)}), id="no-budget"),
        pytest.param({"unified": target(4)}, 25, {}, False, 5,
                     ({"unified": (4, 0)}, {"unified": (1, 0)}), id="room-for-the-canary"),
        pytest.param({"unified": target(4)}, 10, {}, False, 4,
                     ({"unified": (3, 0)}, {"unified": (1, 0)}),
                     id="exact-budget-stable-gives-one"),
        pytest.param({"unified": target(2, 1)}, 25, {}, False, 3,
                     ({"unified": (2, 0)}, {"unified": (1, 0)}), id="a-spare-goes-first"),
        pytest.param({"unified": target(3)}, 100, {"unified": 1}, False, 3,
                     ({"unified": (1, 0)}, {"unified": (2, 0)}),
                     id="all-traffic-one-pod-changes-sides-at-a-time"),
        pytest.param({"unified": target(3)}, 100, {"unified": 2}, False, 3,
                     ({"unified": (0, 0)}, {"unified": (3, 0)}), id="all-traffic-shifted"),
        pytest.param({"unified": target(4)}, 100, {"unified": 1}, True, 5,
                     ({"unified": (2, 0)}, {"unified": (3, 0)}),
                     id="promoting-stable-keeps-what-the-canary-does-not-serve-yet"),
        pytest.param({"unified": target(4, 1)}, 100, {"unified": 0}, True, 10,
                     ({"unified": (4, 1)}, {"unified": (4, 1)}),
                     id="promoting-takes-the-spares-along"),
        pytest.param({"prefill": target(2), "decode": target(4)}, 25, {}, False, 6,
                     ({"prefill": (2, 0), "decode": (2, 0)}, {"prefill": (1, 0), "decode": (1, 0)}),
                     id="two-pools-the-larger-gives"),
    ],
)  # fmt: skip
def test_split_within_the_gpu_budget(  # noqa: PLR0917 - one parameter per column
    stable: dict[str, PoolTarget],
    weight: int,
    serving: dict[str, int],
    promoting: bool,
    budget: int | None,
    expected: tuple[dict[str, tuple[int, int]], dict[str, tuple[int, int]]],
) -> None:
    got_stable, got_canary = split(stable, weight, serving, promoting=promoting, gpus_per_pod=1,
                                   budget=budget)  # fmt: skip
    assert {p: (t.active, t.spares) for p, t in got_stable.items()} == expected[0]
    assert {p: (t.active, t.spares) for p, t in got_canary.items()} == expected[1]


def test_a_canary_under_an_exact_budget_never_holds_more_gpus_than_it() -> None:
    world = World(chat("1", replicas=3, spares=1, budget=3), SETTINGS, NOW)
    settle(world)
    world.service = chat("2", replicas=3, spares=1, budget=3)
    for _ in range(120):
        due = analysis_due(canary_of(world), world.service.spec.rollout, world.now)
        world.step(PASS if due else None)
        replicas = sum(o["spec"]["replicas"] for (kind, _), o in world.children.items()
                       if kind == "Deployment")  # fmt: skip
        assert replicas <= 3 or any(p.demoted_at for p in world.pods.values())
        canary = canary_of(world)
        if canary is not None and canary.phase == "Promoted" and len(world.pods) == 3:
            break
    assert world.status["revision"] == canary_of(world).revision  # type: ignore[union-attr]
