"""The autoscaler's pass without a cluster: pod counting, when it writes `status.autoscaling`
and what, capacity profiles. The Kubernetes side stands behind `RecordingKube` (the real
writes are checked against the API server in tests/cluster/test_autoscaler.py)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from llmfleet.autoscaler.inputs import PoolPods, PoolSignals
from llmfleet.autoscaler.loop import Autoscaler
from llmfleet.autoscaler.metrics import AutoscalerMetrics
from llmfleet.autoscaler.pods import PodView, pool_pods
from llmfleet.autoscaler.profiles import ProfileError, load_profiles
from llmfleet.crds.inference_service import AutoscalingStatus
from tests.autoscaler.builders import PROFILE, at, signals, spec

# ---------------------------------------------------------------------------------------------
# Counting pods


def test_pods_are_counted_per_pool_with_spares_apart_and_without_terminating_ones() -> None:
    pods = [
        PodView("decode", ready=True, serving=True),
        PodView("decode", ready=True, serving=True),
        PodView("decode", ready=True, serving=False),  # a warm spare or a draining pod
        PodView("decode", ready=True, serving=False, terminating=True),  # gone: not a spare
        PodView("decode", ready=False, serving=False),  # starting
        PodView("decode", ready=False, serving=True, unschedulable=True),
        PodView("decode", ready=True, serving=True, terminating=True),
        PodView("prefill", ready=True, serving=True),
    ]
    counted = pool_pods(spec(mode="Disaggregated", warm_spares=1), None, pods)
    assert counted == {
        "prefill": PoolPods(active=1, spares=1, ready=1, starting=0, unschedulable=0),
        "decode": PoolPods(
            active=1, spares=1, ready=2, starting=1, unschedulable=1, ready_spares=1
        ),
    }


@pytest.mark.parametrize(
    ("decided", "expected"),
    [
        (None, (2, 2)),  # no decision yet: the spec's replicas and warm spares
        ({"active": 3, "spares": 0}, (3, 0)),
        ({"active": 9, "spares": 1}, (4, 1)),  # clamped to maxReplicas like the operator does
        ({"active": 0, "spares": 1}, (2, 1)),  # and to minReplicas
    ],
)
def test_targets_follow_the_last_decision_within_min_and_max(
    decided: dict[str, int] | None, expected: tuple[int, int]
) -> None:
    service = spec(
        pools={"unified": {"replicas": 2, "minReplicas": 2, "maxReplicas": 4}}, warm_spares=2
    )
    status = AutoscalingStatus.model_validate({"pools": {"unified": decided}}) if decided else None
    counted = pool_pods(service, status, [])["unified"]
    assert (counted.active, counted.spares) == expected


# ---------------------------------------------------------------------------------------------
# The pass


class RecordingKube:
    """Stands in for the API server: holds service bodies and records the merge patches."""

    def __init__(self, body: dict[str, Any], pods: list[PodView]) -> None:
        self.body = body
        self.pods = pods
        self.writes: list[dict[str, Any]] = []
        self.events: list[str] = []

    def list_services(self) -> list[dict[str, Any]]:
        return [self.body]

    def list_pods(self) -> dict[tuple[str, str], list[PodView]]:
        return {("ns", "svc"): self.pods}

    def write_autoscaling(self, namespace: str, name: str, autoscaling: dict[str, Any]) -> bool:
        assert (namespace, name) == ("ns", "svc")
        self.writes.append(autoscaling)
        # what a JSON merge patch does to the stored status (null removes a key)
        status = self.body.setdefault("status", {})
        merged = {**status.get("autoscaling", {}), **autoscaling}
        merged["pools"] = {
            k: v
            for k, v in {
                **status.get("autoscaling", {}).get("pools", {}),
                **autoscaling["pools"],
            }.items()
            if v is not None
        }
        status["autoscaling"] = merged
        return True

    def event(self, service: dict[str, Any], reason: str, message: str) -> None:
        self.events.append(f"{reason}: {message}")


class Signals:
    def __init__(self) -> None:
        self.by_pool: dict[str, PoolSignals] = {}
        self.gauges: dict[str, PoolSignals] = {}
        self.down = False
        self.failing: set[str] = set()
        """Services whose part of the full read fails (a chunk that timed out)."""
        self.reads: list[str] = []

    def read_services(
        self, wanted: Mapping[tuple[str, str], Sequence[str]]
    ) -> dict[tuple[str, str], dict[str, PoolSignals] | Exception]:
        self.reads.append("full")
        if self.down:
            # as long-winded as urllib3's own errors
            raise ConnectionError("Prometheus at http://127.0.0.1:1: " + "refused; " * 100)
        timed_out = TimeoutError("Prometheus at http://127.0.0.1:9090: Read timed out")
        return {key: timed_out if key[1] in self.failing else dict(self.by_pool) for key in wanted}

    def read_services_gauges(
        self, wanted: Mapping[tuple[str, str], Sequence[str]]
    ) -> dict[tuple[str, str], dict[str, PoolSignals]]:
        self.reads.append("gauges")
        if self.down:
            raise ConnectionError("Prometheus at http://127.0.0.1:1: refused")
        return {key: dict(self.gauges) for key in wanted}


def body(**overrides: Any) -> dict[str, Any]:
    service = spec(warm_spares=1, **overrides)
    return {
        "apiVersion": "llmfleet.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"namespace": "ns", "name": "svc", "uid": "u1"},
        "spec": service.to_wire(),
    }


def serving(n: int, pool: str = "unified") -> list[PodView]:
    return [PodView(pool, ready=True, serving=True) for _ in range(n)]


def sample(scaler: Autoscaler, name: str, **labels: str) -> float | None:
    return scaler.metrics.registry.get_sample_value(name, labels)


def autoscaler(kube: RecordingKube, source: Signals, **kwargs: Any) -> Autoscaler:
    return Autoscaler(
        kube,  # type: ignore[arg-type]
        source,
        AutoscalerMetrics(),
        profiles={PROFILE.model: PROFILE},
        **kwargs,
    )


def test_a_load_step_writes_a_larger_count_with_its_reason_and_an_event() -> None:
    kube, source = RecordingKube(body(), serving(1)), Signals()
    scaler = autoscaler(kube, source)
    source.by_pool["unified"] = signals(1.0, seconds=0)  # 10 streams: one replica
    scaler.run_once(at(0))
    assert kube.writes[-1]["pools"] == {
        "unified": {
            "active": 1,
            "spares": 1,
            "reason": kube.writes[-1]["pools"]["unified"]["reason"],
        }
    }
    assert kube.events == []

    source.by_pool["unified"] = signals(20.0, seconds=15)  # 200 streams at 64 a replica: 4
    scaler.run_once(at(15))
    decided = kube.writes[-1]["pools"]["unified"]
    assert decided["active"] == 4
    assert decided["reason"].startswith("scale up 1 -> 4")
    assert kube.writes[-1]["lastDecisionTime"] == "2026-01-01T00:00:15Z"
    assert kube.events == [f"Scaled: unified: 1 -> 4 serving replicas: {decided['reason']}"]
    labels = {"namespace": "ns", "service": "svc", "pool": "unified", "direction": "up"}
    assert sample(scaler, "llmfleet_autoscaler_scale_events_total", **labels) == 1


def test_a_fast_pass_writes_a_scale_up_from_fresh_gauges_and_nothing_else() -> None:
    kube, source = RecordingKube(body(), serving(2)), Signals()
    scaler = autoscaler(kube, source)
    # before any full pass there is nothing to update: the fast pass reads nothing
    assert scaler.run_fast(at(0)) == []
    assert source.reads == []

    source.by_pool["unified"] = signals(8.0, seconds=0)  # 80 streams at 64 a replica: 2
    scaler.run_once(at(0))
    writes = len(kube.writes)
    state = scaler.states["u1"]

    # 5 s later the gauges show the queue building (the rates are the full pass's still)
    source.gauges["unified"] = signals(0.0, seconds=5, waiting=20.0)
    (outcome,) = scaler.run_fast(at(5))
    decided = kube.writes[-1]["pools"]["unified"]
    assert outcome.written
    assert len(kube.writes) == writes + 1
    assert decided["active"] == 3
    assert decided["reason"].startswith("fast pass: scale up 2 -> 3")
    assert scaler.states["u1"] is state  # learnt and forecast by full passes only
    assert source.reads == ["full", "gauges"]

    # an empty queue: the fast pass holds (never down) and writes nothing
    kube.pods = serving(3)
    source.gauges["unified"] = signals(0.0, seconds=10)
    (held,) = scaler.run_fast(at(10))
    assert not held.written
    assert held.decision.pools["unified"].active == 3
    assert len(kube.writes) == writes + 1
    assert sample(scaler, "llmfleet_autoscaler_pass_seconds_count", **{"pass": "fast"}) == 3


def test_an_unchanged_decision_is_rewritten_only_when_the_refresh_is_due() -> None:
    kube, source = RecordingKube(body(), serving(1)), Signals()
    scaler = autoscaler(kube, source, status_refresh_seconds=60)
    for second in (0, 15, 30, 45, 60, 75):
        source.by_pool["unified"] = signals(1.0, seconds=second)
        scaler.run_once(at(second))
    times = [write["lastDecisionTime"] for write in kube.writes]
    assert times == ["2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z"]


def test_by_default_an_unchanged_decision_is_written_once() -> None:
    """An idle fleet costs no status writes: the decision is written when it changes only."""
    kube, source = RecordingKube(body(), serving(1)), Signals()
    scaler = autoscaler(kube, source)
    for second in range(0, 600, 15):
        source.by_pool["unified"] = signals(1.0, seconds=second)
        scaler.run_once(at(second))
    assert [write["lastDecisionTime"] for write in kube.writes] == ["2026-01-01T00:00:00Z"]
    source.by_pool["unified"] = signals(40.0, seconds=600)  # the load changes the count
    scaler.run_once(at(600))
    assert len(kube.writes) == 2
    assert kube.writes[-1]["pools"]["unified"]["active"] > 1


def test_prometheus_down_holds_every_count_and_is_counted() -> None:
    kube, source = RecordingKube(body(), serving(1)), Signals()
    scaler = autoscaler(kube, source, status_refresh_seconds=0)
    source.by_pool["unified"] = signals(20.0, seconds=0)
    scaler.run_once(at(0))
    kube.pods = serving(4)
    source.down = True
    scaler.run_once(at(15))
    decided = kube.writes[-1]["pools"]["unified"]
    assert decided["active"] == 4
    assert "holding 4" in decided["reason"]
    # The reason names the cause, cut short (the log keeps all of it).
    assert "metrics missing (signals unavailable: " in decided["reason"]
    assert len(decided["reason"]) < 400
    labels = {"namespace": "ns", "service": "svc", "pool": "unified", "cause": "unavailable"}
    assert sample(scaler, "llmfleet_autoscaler_signals_missing_total", **labels) == 1
    assert sample(scaler, "llmfleet_autoscaler_errors_total", stage="signals") == 1


def test_a_pool_that_no_longer_exists_is_removed_from_the_status() -> None:
    kube, source = RecordingKube(body(mode="Disaggregated"), serving(1, "decode")), Signals()
    scaler = autoscaler(kube, source)
    scaler.run_once(at(0))
    assert set(kube.body["status"]["autoscaling"]["pools"]) == {"prefill", "decode"}

    kube.body["spec"] = body()["spec"]  # the service became Unified
    scaler.run_once(at(15))
    assert kube.writes[-1]["pools"]["prefill"] is None
    assert set(kube.body["status"]["autoscaling"]["pools"]) == {"unified"}


def test_services_without_autoscaling_or_with_an_invalid_spec_are_left_alone() -> None:
    off = body()
    off["spec"]["autoscaling"]["enabled"] = False
    kube = RecordingKube(off, serving(1))
    autoscaler(kube, Signals()).run_once(at(0))
    broken = body()
    broken["spec"]["topology"] = {"mode": "Disaggregated"}  # no prefill or decode pool
    kube_broken = RecordingKube(broken, serving(1))
    outcomes = autoscaler(kube_broken, Signals()).run_once(at(0))
    assert (kube.writes, kube_broken.writes, outcomes) == ([], [], [])


def test_the_budget_or_unschedulable_pods_set_limited_with_a_message() -> None:
    kube = RecordingKube(body(gpu_budget=3), serving(1))
    source = Signals()
    source.by_pool["unified"] = signals(20.0, seconds=0)  # wants 4 + 1 spare, budget 3
    scaler = autoscaler(kube, source)
    scaler.run_once(at(0))
    written = kube.writes[-1]
    assert written["limited"] is True
    assert "budget" in written["message"]
    assert written["pools"]["unified"]["active"] + written["pools"]["unified"]["spares"] <= 3
    assert sample(scaler, "llmfleet_autoscaler_limited", namespace="ns", service="svc") == 1


# ---------------------------------------------------------------------------------------------
# Capacity profiles


def test_the_newest_profile_of_a_model_wins(tmp_path: Path) -> None:
    old = PROFILE.model_copy(update={"measured_at": "2025-01-01T00:00:00Z"})
    (tmp_path / "a.json").write_text(PROFILE.model_dump_json(by_alias=True))
    (tmp_path / "b.json").write_text(old.model_dump_json(by_alias=True))
    (tmp_path / "notes.txt").write_text("not a profile, not read")
    assert load_profiles(tmp_path) == {PROFILE.model: PROFILE}
    assert load_profiles(None) == {}


def test_a_file_that_is_no_profile_is_named_in_the_error(tmp_path: Path) -> None:
    (tmp_path / "broken.json").write_text('{"model": "m"}')
    with pytest.raises(ProfileError, match=r"broken\.json: not a capacity profile \(url: "):
        load_profiles(tmp_path)
    with pytest.raises(ProfileError, match="does not exist"):
        load_profiles(tmp_path / "nowhere")


@pytest.mark.parametrize(
    ("pools", "floor"),
    [
        pytest.param({"unified": {"replicas": 2, "minReplicas": None}}, 2, id="unset-policy-own"),
        pytest.param({"unified": {"replicas": 2, "minReplicas": 1}}, 1, id="the-users"),
        pytest.param({"unified": {"replicas": 3, "minReplicas": 3}}, 3, id="the-users-above-2"),
    ],
)
def test_the_floor_a_decision_allowed_is_a_metric(
    pools: dict[str, dict[str, Any]], floor: int
) -> None:
    kube, source = RecordingKube(body(pools=pools), serving(2)), Signals()
    scaler = autoscaler(kube, source)
    labels = {"namespace": "ns", "service": "svc", "pool": "unified"}
    scaler.run_once(at(0))  # no signals: held fail-static, nothing sized, no floor yet
    assert sample(scaler, "llmfleet_autoscaler_floor_replicas", **labels) is None
    source.by_pool["unified"] = signals(0.5, seconds=15)  # needs one replica
    scaler.run_once(at(15))
    assert sample(scaler, "llmfleet_autoscaler_floor_replicas", **labels) == floor


def test_a_restarted_autoscaler_keeps_a_pool_it_measured_light_at_one() -> None:
    """minReplicas unset: 31 minutes of load one replica serves make the floor 1. The memory
    behind it is in status.autoscaling, so a new process carries on from it, where one without
    that memory would start over at the safe floor of 2."""
    light = {"unified": {"replicas": 2, "minReplicas": None}}
    kube, source = RecordingKube(body(pools=light), serving(2)), Signals()
    first = autoscaler(kube, source)
    labels = {"namespace": "ns", "service": "svc", "pool": "unified"}
    for minute in range(0, 32):
        source.by_pool["unified"] = signals(0.5, seconds=minute * 60)
        first.run_once(at(minute * 60))
    assert sample(first, "llmfleet_autoscaler_floor_replicas", **labels) == 1
    kept = kube.body["status"]["autoscaling"]["pools"]["unified"]["floorMemory"]
    assert kept == {"observedSince": "2026-01-01T00:00:00Z", "longestLullSeconds": 0.0}

    source.by_pool["unified"] = signals(0.5, seconds=32 * 60)
    restarted = autoscaler(kube, source)
    restarted.run_once(at(32 * 60))
    assert sample(restarted, "llmfleet_autoscaler_floor_replicas", **labels) == 1

    forgetful = autoscaler(RecordingKube(body(pools=light), serving(2)), source)
    forgetful.run_once(at(32 * 60))
    assert sample(forgetful, "llmfleet_autoscaler_floor_replicas", **labels) == 2


def test_setting_min_replicas_removes_the_floors_memory() -> None:
    kube, source = (
        RecordingKube(body(pools={"unified": {"minReplicas": None}}), serving(1)),
        Signals(),
    )
    scaler = autoscaler(kube, source)
    source.by_pool["unified"] = signals(0.5, seconds=0)
    scaler.run_once(at(0))
    assert kube.writes[-1]["pools"]["unified"]["floorMemory"]["observedSince"]
    kube.body["spec"]["topology"]["unified"]["minReplicas"] = 1
    source.by_pool["unified"] = signals(0.5, seconds=60)
    scaler.run_once(at(60))
    assert kube.writes[-1]["pools"]["unified"]["floorMemory"] is None  # null: merge patch removes


def test_a_busy_pools_floor_memory_is_rewritten_once_per_grain_not_per_pass() -> None:
    kube, source = (
        RecordingKube(body(pools={"unified": {"minReplicas": None}}), serving(1)),
        Signals(),
    )
    scaler = autoscaler(kube, source)
    for second in range(0, 900, 15):  # 60 passes, each sizing the pool busy (2 or more)
        source.by_pool["unified"] = signals(40.0, seconds=second)
        kube.pods = serving(max(1, kube.writes[-1]["pools"]["unified"]["active"]) if kube.writes
                            else 1)  # fmt: skip
        scaler.run_once(at(second))
    busy = [w["pools"]["unified"]["floorMemory"]["busyAt"] for w in kube.writes]
    # The first write, then one each time busyAt enters another 5-minute grain (at 300, 600).
    assert 2 <= len(kube.writes) <= 4, busy
    assert busy[-1] >= "2026-01-01T00:10:00Z"


class FleetKube(RecordingKube):
    """`count` autoscaled services (svc-0, svc-1, …), each with one serving pod."""

    def __init__(self, count: int) -> None:
        super().__init__(body(), serving(1))
        self.bodies = []
        for index in range(count):
            one = body()
            one["metadata"] |= {"name": f"svc-{index}", "uid": f"u{index}"}
            self.bodies.append(one)
        self.written: list[str] = []

    def list_services(self) -> list[dict[str, Any]]:
        return self.bodies

    def list_pods(self) -> dict[tuple[str, str], list[PodView]]:
        return {("ns", one["metadata"]["name"]): self.pods for one in self.bodies}

    def write_autoscaling(self, namespace: str, name: str, autoscaling: dict[str, Any]) -> bool:
        self.written.append(name)
        return True


def test_one_read_of_the_signals_per_pass_whatever_the_number_of_services() -> None:
    kube, source = FleetKube(50), Signals()
    scaler = autoscaler(kube, source)
    source.by_pool["unified"] = signals(1.0, seconds=0)
    source.gauges["unified"] = signals(0.0, seconds=5, waiting=1.0)
    scaler.run_once(at(0))
    scaler.run_fast(at(5))
    assert source.reads == ["full", "gauges"]
    assert set(kube.written) == {f"svc-{index}" for index in range(50)}


class SlowFleetKube(FleetKube):
    """A `FleetKube` whose writes wait at a barrier of `together` writers (as long round trips
    to a busy API server would overlap), and fail for the services named in `refusing`."""

    def __init__(self, count: int, together: int) -> None:
        super().__init__(count)
        self.barrier = threading.Barrier(together, timeout=5)
        self.refusing: set[str] = set()
        self.threads: set[str] = set()

    def write_autoscaling(self, namespace: str, name: str, autoscaling: dict[str, Any]) -> bool:
        self.threads.add(threading.current_thread().name)
        self.barrier.wait()  # BrokenBarrierError after 5 s unless `together` write at once
        if name in self.refusing:
            raise ApiException(status=500, reason="Internal Server Error")
        return super().write_autoscaling(namespace, name, autoscaling)


def test_a_pass_writes_its_statuses_several_at_once_and_reports_in_the_services_order(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kube, source = SlowFleetKube(8, together=4), Signals()
    scaler = autoscaler(kube, source, write_concurrency=4)
    source.by_pool["unified"] = signals(1.0, seconds=0)
    with caplog.at_level(logging.INFO, "llmfleet.autoscaler"):
        outcomes = scaler.run_once(at(0))
    assert [o.name for o in outcomes] == [f"svc-{index}" for index in range(8)]
    assert all(o.written for o in outcomes)
    assert sorted(kube.written) == sorted(o.name for o in outcomes)
    assert len(kube.threads) == 4, kube.threads  # four writers, none of them the pass's thread
    assert threading.current_thread().name not in kube.threads
    assert sample(scaler, "llmfleet_autoscaler_errors_total", stage="write") is None


def test_a_refused_write_fails_only_its_service_and_the_next_pass_writes_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kube, source = SlowFleetKube(4, together=2), Signals()
    kube.refusing = {"svc-2"}
    scaler = autoscaler(kube, source, write_concurrency=2)
    source.by_pool["unified"] = signals(1.0, seconds=0)
    with caplog.at_level(logging.INFO, "llmfleet.autoscaler"):
        outcomes = scaler.run_once(at(0))
    assert [o.name for o in outcomes] == ["svc-0", "svc-1", "svc-3"]
    assert sorted(kube.written) == ["svc-0", "svc-1", "svc-3"]
    failed = [r for r in caplog.records if r.getMessage() == "autoscaling ns/svc-2 failed"]
    assert len(failed) == 1
    assert failed[0].exc_info is not None
    assert sample(scaler, "llmfleet_autoscaler_errors_total", stage="write") == 1
    kube.refusing, kube.written = set(), []
    kube.barrier = threading.Barrier(1)
    scaler.run_once(at(15))
    assert "svc-2" in kube.written


def merged(stored: dict[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """`stored` after a JSON merge patch (RFC 7386: a null removes its key)."""
    result = dict(stored)
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(result.get(key), dict):
            result[key] = merged(result[key], value)
        else:
            result[key] = merged({}, value) if isinstance(value, Mapping) else value
    return result


class StoringFleetKube(FleetKube):
    """A `FleetKube` whose writes merge into the services' stored status, as the API server's
    do, so that a pass after a write finds it written."""

    def write_autoscaling(self, namespace: str, name: str, autoscaling: dict[str, Any]) -> bool:
        super().write_autoscaling(namespace, name, autoscaling)
        one = next(b for b in self.bodies if b["metadata"]["name"] == name)
        status = one.setdefault("status", {})
        status["autoscaling"] = merged(status.get("autoscaling", {}), autoscaling)
        return True


def test_writes_that_change_no_target_are_bounded_per_pass_and_done_by_the_next_passes() -> None:
    """Five first decisions that keep the spec's counts (one replica, one spare), no time for
    them: one a full pass, none in a fast pass."""
    kube, source = StoringFleetKube(5), Signals()
    scaler = autoscaler(kube, source, other_writes_seconds=0.0)
    source.by_pool["unified"] = signals(1.0, seconds=0)  # 10 streams: one replica, as the spec
    source.gauges["unified"] = signals(0.0, seconds=0)
    written, deferred = [], []
    for second in range(0, 90, 15):
        kube.written = []
        outcomes = scaler.run_once(at(second))
        assert all(o.decision.pools["unified"].active == 1 for o in outcomes)
        written.append(kube.written)
        deferred.append(sample(scaler, "llmfleet_autoscaler_status_writes_deferred"))
        if second == 0:
            scaler.run_fast(at(second + 5))
            assert kube.written == ["svc-0"], "a fast pass wrote what changes no target"
            assert sample(scaler, "llmfleet_autoscaler_status_writes_deferred") == 4
    assert written == [["svc-0"], ["svc-1"], ["svc-2"], ["svc-3"], ["svc-4"], []]
    assert deferred == [4, 3, 2, 1, 0, 0]


def test_without_a_bound_a_pass_writes_them_all() -> None:
    kube, source = StoringFleetKube(5), Signals()
    scaler = autoscaler(kube, source, write_concurrency=2)
    source.by_pool["unified"] = signals(1.0, seconds=0)
    scaler.run_once(at(0))
    assert sorted(kube.written) == [f"svc-{index}" for index in range(5)]
    assert sample(scaler, "llmfleet_autoscaler_status_writes_deferred") == 0


def test_writes_that_change_a_target_are_all_done_whatever_the_bound() -> None:
    kube, source = StoringFleetKube(5), Signals()
    scaler = autoscaler(kube, source, other_writes_seconds=0.0, write_concurrency=2)
    source.by_pool["unified"] = signals(20.0, seconds=0)  # 200 streams: more than one replica
    outcomes = scaler.run_once(at(0))
    assert all(o.decision.pools["unified"].active > 1 for o in outcomes)
    assert sorted(kube.written) == [f"svc-{index}" for index in range(5)]
    assert sample(scaler, "llmfleet_autoscaler_status_writes_deferred") == 0


def test_signals_down_hold_every_service_with_one_line(caplog: pytest.LogCaptureFixture) -> None:
    kube, source = FleetKube(20), Signals()
    source.down = True
    scaler = autoscaler(kube, source)
    with caplog.at_level(logging.INFO, "llmfleet.autoscaler"):
        for second in range(0, 60, 15):  # down for a minute: one line, one read a pass
            scaler.run_once(at(second))
        source.down = False
        scaler.run_once(at(60))
    said = [r.getMessage() for r in caplog.records if "signals unavailable" in r.getMessage()]
    assert len(said) == 2
    assert said[1].startswith("resolved: signals unavailable")
    assert source.reads == ["full"] * 5
    assert sample(scaler, "llmfleet_autoscaler_errors_total", stage="signals") == 4


def test_a_failed_part_of_the_read_holds_only_its_services(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kube, source = FleetKube(4), Signals()
    scaler = autoscaler(kube, source, status_refresh_seconds=0)
    source.by_pool["unified"] = signals(20.0, seconds=0)
    scaler.run_once(at(0))
    kube.pods, kube.written = serving(4), []
    source.failing = {"svc-1", "svc-2"}
    with caplog.at_level(logging.INFO, "llmfleet.autoscaler"):
        outcomes = scaler.run_once(at(15))
        scaler.run_once(at(30))
        source.failing = set()
        scaler.run_once(at(45))
    reasons = {o.name: o.decision.pools["unified"].reason for o in outcomes}
    assert sorted(n for n, r in reasons.items() if "signals unavailable" in r) == ["svc-1", "svc-2"]
    said = [r.getMessage() for r in caplog.records if "signals unavailable" in r.getMessage()]
    assert said[0].startswith("signals unavailable for 2 of 4 services, their pools hold: ")
    assert len(said) == 2  # said once while it lasts, once resolved
    assert sample(scaler, "llmfleet_autoscaler_errors_total", stage="signals") == 2
    for name, cause in [("svc-0", "no-series"), ("svc-1", "unavailable")]:
        labels = {"namespace": "ns", "service": name, "pool": "unified", "cause": cause}
        missing = sample(scaler, "llmfleet_autoscaler_signals_missing_total", **labels)
        assert missing == (2 if cause == "unavailable" else None)


def test_an_invalid_spec_is_said_once_while_it_stays(caplog: pytest.LogCaptureFixture) -> None:
    kube, source = FleetKube(2), Signals()
    kube.bodies[1]["spec"]["topology"]["mode"] = "Hybrid"
    scaler = autoscaler(kube, source)
    with caplog.at_level(logging.INFO, "llmfleet.autoscaler"):
        for second in range(0, 60, 15):
            scaler.run_once(at(second))
    said = [r.getMessage() for r in caplog.records if "skipping ns/svc-1" in r.getMessage()]
    assert len(said) == 1
    assert set(kube.written) == {"svc-0"}
