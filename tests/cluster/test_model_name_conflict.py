"""Two services claiming one model name (issue 28), with the real operator and API server: each
claimant's status says so (`ModelNameConflict`, True; `ModelNameShared` on the one created
first, which the gateway routes to, `ModelNameTaken` on the other), each gets one Warning Event,
idle passes add none, and deleting the second turns the first's condition False with one
Normal Event."""

from __future__ import annotations

import json
import os

import pytest

from tests.cluster.kube import Kube, condition
from tests.cluster.operator_process import passes
from tests.net import free_port

pytestmark = pytest.mark.cluster

NAMESPACE = f"claims-{os.getpid() % 10000}"
PORT = free_port()
OPERATOR_ENV = {"LLMFLEET_OPERATOR_RESYNC_SECONDS": "2",
                "LLMFLEET_OPERATOR_FULL_RESYNC_SECONDS": "4",
                "LLMFLEET_OPERATOR_METRICS_PORT": str(PORT)}  # fmt: skip
"""Short full resyncs: the idle window below sees several passes of each service (counted on
the operator's metrics port)."""
MODEL = "org/shared-name"


def create(kube: Kube, name: str) -> None:
    service = {
        "apiVersion": "llmfleet.dev/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {"model": {"name": MODEL}, "runtime": {"gpu": {"type": "H100"}},
                 "topology": {"mode": "Unified", "unified": {"replicas": 0}}},
    }  # fmt: skip
    kube.kubectl("create", "-n", NAMESPACE, "-f", "-", stdin=json.dumps(service))


def said(kube: Kube, name: str) -> list[str]:
    """Reasons of the operator's model-name Events about `name`, repeats counted."""
    items = kube.get("events", "-n", NAMESPACE,
                     "--field-selector", f"involvedObject.name={name}")["items"]  # fmt: skip
    return sorted(
        reason
        for item in items
        if (reason := item.get("reason", "")).startswith("ModelName")
        for _ in range(item.get("count") or 1)
    )


def test_a_conflict_is_on_both_statuses_and_said_once_per_change(
    kube: Kube, operator_namespace: str
) -> None:
    create(kube, "first")
    kube.wait_for(lambda: condition(kube, NAMESPACE, "first"), 60, "the first service's status")
    create(kube, "second")

    def reasons() -> tuple[str, str]:
        return (
            condition(kube, NAMESPACE, "first", "ModelNameConflict").get("reason", ""),
            condition(kube, NAMESPACE, "second", "ModelNameConflict").get("reason", ""),
        )

    kube.wait_for(lambda: reasons() == ("ModelNameShared", "ModelNameTaken"), 60,
                  "ModelNameConflict on both services")  # fmt: skip
    taken = condition(kube, NAMESPACE, "second", "ModelNameConflict")
    assert taken["status"] == "True"
    assert f"the gateway routes it to {NAMESPACE}/first" in taken["message"]
    kube.wait_for(lambda: said(kube, "second") == ["ModelNameTaken"], 30, "the Event on second")
    kube.wait_for(lambda: said(kube, "first") == ["ModelNameShared"], 30, "the Event on first")

    # Idle passes (a full resync every 2-4 s, two of each service at least) say nothing more.
    enough = passes(PORT) + 4
    kube.wait_for(lambda: passes(PORT) >= enough, 60, "four more passes")
    assert (said(kube, "first"), said(kube, "second")) == (["ModelNameShared"],
                                                           ["ModelNameTaken"])  # fmt: skip

    kube.kubectl("delete", "-n", NAMESPACE, "inferenceservice", "second")
    kube.wait_for(
        lambda: condition(kube, NAMESPACE, "first", "ModelNameConflict").get("status") == "False",
        30,
        "the first service's conflict resolved",
    )
    kube.wait_for(
        lambda: said(kube, "first") == ["ModelNameShared", "ModelNameUnique"],
        30,
        "one Event for the resolution",
    )
