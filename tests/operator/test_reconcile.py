"""One reconcile pass against a recording stand-in for the API server: what the pass does when a
write it does not depend on fails. (The real API server: tests/cluster/test_operator.py.)"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException

from llmfleet.operator.observed import Observed
from llmfleet.operator.reconcile import Reconciler
from tests.operator.test_plan import SETTINGS, load


class RefusingEvents:
    """Serves one service with nothing observed yet; refuses every Event as a namespace being
    deleted does (403); records the status written."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        self.statuses: list[Mapping[str, Any]] = []
        self.events_tried = 0

    def get_service(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.body

    def observe(self, namespace: str, name: str, status: Mapping[str, Any]) -> Observed:
        return Observed()

    def apply_child(self, service: str, manifest: Mapping[str, Any]) -> None:
        pass

    def change_pod(self, namespace: str, change: object) -> None:
        pass

    def event(self, owner: Mapping[str, Any], reason: str, message: str, warning: bool) -> None:
        self.events_tried += 1
        raise ApiException(status=403, reason="Forbidden")

    def write_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        self.statuses.append(status)


def test_a_refused_event_is_counted_and_the_status_is_still_written() -> None:
    body = load("unified").model_dump(by_alias=True, exclude_none=True)
    kube = RefusingEvents(body)
    reconciler = Reconciler(kube, SETTINGS)  # type: ignore[arg-type]

    reconciler.reconcile("team", body["metadata"]["name"])

    assert kube.events_tried >= 1  # a first pass reports its conditions as events
    assert len(kube.statuses) == 1
    assert kube.statuses[0]["conditions"]
    failed = reconciler.metrics.registry.get_sample_value(
        "llmfleet_operator_events_failed_total",
        {"namespace": "team", "service": body["metadata"]["name"], "reason": "PodsStarting"},
    )
    assert failed == 1
