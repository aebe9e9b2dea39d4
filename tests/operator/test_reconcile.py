"""Reconcile passes against a recording stand-in for the API server: what a pass does when a
write fails. (The real API server: tests/cluster/test_operator.py and test_operator_specs.py.)"""

from __future__ import annotations

import copy
import itertools
import json
import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from llmfleet.crds import Condition
from llmfleet.operator.answers import Transient
from llmfleet.operator.drift import stamped
from llmfleet.operator.observed import Observed, ObservedChild
from llmfleet.operator.reconcile import Gone, Reconciler
from llmfleet.operator.settings import OperatorSettings
from tests.operator.test_plan import SETTINGS, load

START = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def refusal(code: int, reason: str, message: str) -> ApiException:
    """An ApiException as the client raises it for an API server's Status answer."""
    error = ApiException(status=code, reason=reason)
    error.body = json.dumps(
        {"kind": "Status", "status": "Failure", "reason": reason, "code": code,
         "message": message}
    )  # fmt: skip
    return error


def merge_patch(target: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386, as the API server merges a status patch."""
    merged = copy.deepcopy(dict(target))
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, Mapping):
            inner = merged.get(key)
            merged[key] = merge_patch(inner if isinstance(inner, Mapping) else {}, value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


class StandIn:
    """Serves one service and keeps its status as the API server would (merge of what the
    pass writes, read back by the next pass); refuses the writes `refuse` picks; records
    every apply tried and every Event posted."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        self.status: dict[str, Any] = {}
        self.tried: list[tuple[str, str]] = []
        self.events: list[tuple[str, str, bool]] = []
        self.refuse: Callable[[Mapping[str, Any]], Exception | None] = lambda _: None
        self.refuse_events = False
        self.stored: dict[tuple[str, str], dict[str, Any]] = {}
        """(kind, name) -> each child applied, as stored (stamped); observed only with `keep`."""
        self.keep = False
        self.status_writes = 0
        self.deleted_behind_the_watch = False
        """The service is deleted, but `get_service` (the watch) does not know yet."""
        self.asked_stored = 0

    def still_stored(self, namespace: str, name: str, uid: str) -> bool:
        self.asked_stored += 1
        return (
            self.body is not None
            and not self.deleted_behind_the_watch
            and self.body["metadata"]["uid"] == uid
        )

    def get_service(self, namespace: str, name: str) -> dict[str, Any] | None:
        if self.keep and self.body is not None:
            return {**self.body, "status": copy.deepcopy(self.status)}
        return self.body

    def observe(
        self, namespace: str, name: str, status: Mapping[str, Any], pools: object, model: str
    ) -> Observed:
        conditions = self.status.get("conditions", [])
        children = tuple(
            ObservedChild(
                api_version=body["apiVersion"], kind=kind, namespace=namespace, name=child,
                uid=f"uid-{child}", labels=body["metadata"].get("labels") or {},
                controller_uid=self.body["metadata"]["uid"], body=body,
            )
            for (kind, child), body in self.stored.items()
        ) if self.keep else ()  # fmt: skip
        return Observed(
            conditions=tuple(Condition.model_validate(c) for c in conditions), children=children
        )

    def apply_child(self, service: str, manifest: Mapping[str, Any]) -> None:
        self.tried.append((manifest["kind"], manifest["metadata"]["name"]))
        error = self.refuse(manifest)
        if error is not None:
            raise error
        self.stored[(manifest["kind"], manifest["metadata"]["name"])] = stamped(manifest)

    def change_pod(self, namespace: str, change: object) -> None:
        pass

    def event(self, owner: Mapping[str, Any], reason: str, message: str, warning: bool) -> None:
        if self.refuse_events:
            raise ApiException(status=403, reason="Forbidden")
        self.events.append((reason, message, warning))

    def write_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        self.status = merge_patch(self.status, status)
        self.status_writes += 1

    def condition(self, kind: str) -> dict[str, Any]:
        return next(c for c in self.status["conditions"] if c["type"] == kind)


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def service_body() -> dict[str, Any]:
    return load("unified").model_dump(by_alias=True, exclude_none=True)


def test_a_pass_over_what_it_wrote_writes_nothing_and_a_hand_edit_is_put_back() -> None:
    body = service_body()
    body["metadata"]["uid"] = "svc-uid"
    kube = StandIn(body)
    kube.keep = True
    clock = Clock()
    reconciler = Reconciler(kube, SETTINGS, clock=clock)  # type: ignore[arg-type]
    reconciler.reconcile("team", "llama-8b")
    assert kube.tried
    assert kube.status_writes == 1

    # Nothing changed (a resync, a wake-up by another pod's event): no write at all.
    tried, events = list(kube.tried), list(kube.events)
    for _ in range(3):
        clock.advance(30)
        reconciler.reconcile("team", "llama-8b")
    assert (kube.tried, kube.status_writes, kube.events) == (tried, 1, events)

    # Someone edits the Deployment by hand: that child alone is applied again.
    deployment = kube.stored[DEPLOYMENT]
    deployment["spec"]["template"]["spec"]["containers"][0]["image"] = "other:1"
    reconciler.reconcile("team", "llama-8b")
    assert kube.tried[len(tried) :] == [DEPLOYMENT]
    assert kube.status_writes == 1


def test_a_refused_event_is_counted_and_the_status_is_still_written() -> None:
    body = service_body()
    kube = StandIn(body)
    kube.refuse_events = True  # as a namespace being deleted does (403)
    reconciler = Reconciler(kube, SETTINGS)  # type: ignore[arg-type]

    reconciler.reconcile("team", body["metadata"]["name"])

    assert kube.status["conditions"]
    failed = reconciler.metrics.registry.get_sample_value(
        "llmfleet_operator_events_failed_total",
        {"namespace": "team", "service": body["metadata"]["name"], "reason": "NoServingReplicas"},
    )
    assert failed == 1


def test_a_throttled_apply_ends_the_pass_unreported_and_the_next_pass_applies_it() -> None:
    """A transient answer (`kube.Transient`, raised at once: nothing sleeps in a pass) is no
    refusal: no condition, no child back-off; the service's loop runs the pass again."""
    body = service_body()
    kube = StandIn(body)
    throttled = Transient(refusal(429, "TooManyRequests", "slow down"))
    kube.refuse = lambda manifest: throttled if manifest["kind"] == "Deployment" else None
    clock = Clock()
    reconciler = Reconciler(kube, SETTINGS, clock=clock)  # type: ignore[arg-type]

    with pytest.raises(Transient):
        reconciler.reconcile("team", body["metadata"]["name"])
    assert kube.status_writes == 0

    kube.refuse = lambda _: None
    tried = len(kube.tried)
    reconciler.reconcile("team", body["metadata"]["name"])  # at once: no back-off stands
    assert DEPLOYMENT in kube.tried[tried:]
    assert all(c["reason"] != "ApplyFailed" for c in kube.status["conditions"])


DEPLOYMENT = ("Deployment", "llama-8b-unified")
QUOTA = (
    'poddisruptionbudgets.policy "llama-8b-unified" is forbidden: exceeded quota: no-pdbs, '
    "requested: count/poddisruptionbudgets.policy=1, used: count/poddisruptionbudgets.policy=0, "
    "limited: count/poddisruptionbudgets.policy=0"
)
INVALID = (
    'Deployment.apps "llama-8b-unified" is invalid: spec.template.spec.containers[0].env[1]: '
    'Duplicate value: {"name":"A"}'
)


@pytest.mark.parametrize(
    ("kind", "error", "reason"),
    [
        pytest.param("Deployment", refusal(422, "Invalid", INVALID), "InvalidSpec",
                     id="invalid-422-is-invalid-spec"),
        pytest.param("PodDisruptionBudget", refusal(403, "Forbidden", QUOTA), "ApplyFailed",
                     id="forbidden-403-is-apply-failed"),
        pytest.param("Deployment", refusal(500, "InternalError", "etcd timed out"),
                     "ApplyFailed", id="server-error-500-is-apply-failed"),
    ],
)  # fmt: skip
def test_a_refused_child_is_reported_once_and_the_others_are_applied(
    kind: str, error: ApiException, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    body = service_body()
    kube = StandIn(body)
    kube.refuse = lambda manifest: error if manifest["kind"] == kind else None
    clock = Clock()
    reconciler = Reconciler(kube, SETTINGS, clock=clock)  # type: ignore[arg-type]

    with caplog.at_level(logging.INFO, "llmfleet.operator"):
        requeue = reconciler.reconcile("team", "llama-8b")
        for _ in range(5):  # woken again and again (pods, status writes) within the back-off
            clock.advance(0.3)
            reconciler.reconcile("team", "llama-8b")

    ready, degraded = kube.condition("Ready"), kube.condition("Degraded")
    print(f"Ready={ready['status']} {ready['reason']}: {ready['message']}")
    assert (ready["status"], ready["reason"]) == ("False", reason)
    assert (degraded["status"], degraded["reason"]) == ("True", reason)
    assert json.loads(str(error.body))["message"] in ready["message"]
    assert [k for k, _ in kube.tried].count(kind) == 1, "tried once within the back-off"
    assert {k for k, _ in kube.tried} == {"ConfigMap", "Service", "Deployment",
                                          "PodDisruptionBudget", "NetworkPolicy"}  # fmt: skip
    warnings = [event for event in kube.events if event[2]]
    assert [event[0] for event in warnings] == [reason], "one Warning, not one per pass"
    assert "Ready=False, Degraded=True" in warnings[0][1]
    refused = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(refused) == 1
    assert "the API server refused" in refused[0].getMessage()
    assert refused[0].exc_info is None, "an API refusal is no traceback"
    assert len(caplog.records) == 2, "and the Event, once"
    assert requeue == SETTINGS.retry_seconds
    counted = reconciler.metrics.registry.get_sample_value(
        "llmfleet_operator_apply_refused_total",
        {"namespace": "team", "service": "llama-8b", "kind": kind, "code": str(error.status)},
    )
    assert counted == 1


def test_refusals_back_off_exponentially_to_the_cap_and_an_edit_is_tried_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    body = service_body()
    kube = StandIn(body)
    kube.refuse = lambda m: refusal(422, "Invalid", INVALID) if m["kind"] == "Deployment" else None
    clock = Clock()
    settings = OperatorSettings(drain_seconds=90, retry_seconds=1, retry_max_seconds=8)
    reconciler = Reconciler(kube, settings, clock=clock)  # type: ignore[arg-type]

    tries: list[float] = []
    waits: list[float | None] = []
    with caplog.at_level(logging.INFO, "llmfleet.operator"):
        for _ in range(600):  # a pass every 0.1 s for a minute: woken far more than needed
            before = len(kube.tried)
            waits.append(reconciler.reconcile("team", "llama-8b"))
            if DEPLOYMENT in kube.tried[before:]:
                tries.append((clock.now - START).total_seconds())
            clock.advance(0.1)
    gaps = [round(later - earlier, 1) for earlier, later in itertools.pairwise(tries)]
    assert gaps[:5] == [1, 2, 4, 8, 8]
    assert set(gaps[5:]) == {8}
    lines = [r for r in caplog.records if "refused Deployment" in r.getMessage()]
    assert len(lines) == len(tries), "one line per back-off step"
    assert all(wait is not None and 0 < wait <= 8 for wait in waits)

    # The spec is edited: the new manifest is tried at once, whatever the back-off says.
    body["spec"]["runtime"]["maxNumSeqs"] = 64
    before = len(kube.tried)
    reconciler.reconcile("team", "llama-8b")
    assert DEPLOYMENT in kube.tried[before:]


def test_once_the_refusal_ends_the_status_recovers() -> None:
    body = service_body()
    kube = StandIn(body)
    refusing = True
    kube.refuse = lambda m: (
        refusal(403, "Forbidden", QUOTA) if refusing and m["kind"] == "Deployment" else None
    )
    clock = Clock()
    reconciler = Reconciler(kube, SETTINGS, clock=clock)  # type: ignore[arg-type]
    assert reconciler.reconcile("team", "llama-8b") == SETTINGS.retry_seconds
    assert kube.condition("Degraded")["reason"] == "ApplyFailed"

    refusing = False
    clock.advance(SETTINGS.retry_seconds)
    reconciler.reconcile("team", "llama-8b")
    assert kube.condition("Degraded")["status"] == "False"
    assert kube.condition("Ready")["reason"] == "NoServingReplicas"  # no pod serves yet
    assert reconciler.backoff.next_try(("team", "llama-8b"), clock.now.timestamp()) is None


def test_each_pass_publishes_slo_conditions_and_pool_counts_and_a_gone_service_none() -> None:
    """The chart's alerts and dashboards read these gauges (they cannot read status)."""
    body = service_body()
    body["spec"]["slo"] = {"ttftP95Ms": 400, "itlP95Ms": 40}
    name = body["metadata"]["name"]
    kube = StandIn(body)
    reconciler = Reconciler(kube, SETTINGS)  # type: ignore[arg-type]
    registry = reconciler.metrics.registry

    def sample(metric: str, **labels: str) -> float | None:
        value: float | None = registry.get_sample_value(
            metric, {"namespace": "team", "service": name, **labels}
        )
        return value

    reconciler.reconcile("team", name)
    assert sample("llmfleet_operator_slo_target_seconds", latency="ttft") == 0.4
    assert sample("llmfleet_operator_slo_target_seconds", latency="itl") == 0.04
    ready = kube.condition("Ready")
    assert ready["status"] == "False"
    assert sample("llmfleet_operator_service_condition", type="Ready", reason=ready["reason"]) == 0
    replicas = body["spec"]["topology"]["unified"]["replicas"]
    assert sample("llmfleet_operator_pool_replicas", pool="unified", state="serving") == 0
    assert sample("llmfleet_operator_pool_replicas", pool="unified", state="pending") == 0
    assert replicas > 0

    del body["spec"]["slo"]["itlP95Ms"]
    reconciler.reconcile("team", name)
    assert sample("llmfleet_operator_slo_target_seconds", latency="itl") is None  # series gone

    kube.body = None  # type: ignore[assignment]  # deleted
    with pytest.raises(Gone):
        reconciler.reconcile("team", name)
    for metric in ("slo_target_seconds", "service_condition", "pool_replicas"):
        assert not [s for family in registry.collect() if family.name.endswith(metric)
                    for s in family.samples if s.labels.get("service") == name]  # fmt: skip


def test_a_spec_the_models_refuse_is_stalled_for_this_generation() -> None:
    """What admission should have refused (an older CRD let it in): the status says so for this
    generation, so GitOps tools report the failure instead of waiting."""
    body = service_body()
    body["metadata"]["generation"] = 7
    body["spec"]["topology"] = {"mode": "Hybrid"}
    kube = StandIn(body)
    Reconciler(kube, SETTINGS).reconcile("team", body["metadata"]["name"])  # type: ignore[arg-type]
    assert kube.status["observedGeneration"] == 7
    said = {c["type"]: (c["status"], c["reason"]) for c in kube.status["conditions"]}
    assert said == {
        "Ready": ("False", "InvalidSpec"),
        "Degraded": ("True", "InvalidSpec"),
        "Stalled": ("True", "InvalidSpec"),
        "Reconciling": ("False", "InvalidSpec"),
    }


def test_a_service_deleted_behind_the_watch_gets_no_child_created_again() -> None:
    """The collector deletes a deleted service's Deployment; that deletion can come through
    the children's watch before the service's own comes through its watch. A pass then sees
    the service and no Deployment: it must not create the Deployment again (its pods would
    start, then be collected). It asks the API server once, before the first creation."""
    body = service_body()
    body["metadata"]["uid"] = "uid-of-the-service"
    name = body["metadata"]["name"]
    kube = StandIn(body)
    kube.keep = True
    reconciler = Reconciler(kube, SETTINGS)  # type: ignore[arg-type]

    reconciler.reconcile("team", name)  # creates every child: one question first
    assert kube.tried
    assert kube.asked_stored == 1
    created = len(kube.tried)
    reconciler.reconcile("team", name)  # nothing to create: no question
    assert kube.asked_stored == 1
    assert len(kube.tried) == created

    deployment = next(key for key in kube.stored if key[0] == "Deployment")
    del kube.stored[deployment]  # the collector's deletion, seen by the children's watch
    kube.deleted_behind_the_watch = True
    with pytest.raises(Gone):
        reconciler.reconcile("team", name)
    assert len(kube.tried) == created, kube.tried[created:]

    kube.deleted_behind_the_watch = False  # a Deployment deleted by hand is put back
    reconciler.reconcile("team", name)
    assert kube.tried[created:] == [deployment]
