"""`llmfleet_autoscaler_start_seconds`: an autoscaler's start, step by step, from its process's
start (`core.start_steps`) — serving, listed, first pass; and its watches started together."""

from __future__ import annotations

import time
from typing import Any

from kubernetes import client

from llmfleet.autoscaler.cli import note_start
from llmfleet.autoscaler.kube import Kube
from llmfleet.autoscaler.metrics import AutoscalerMetrics


def steps(metrics: AutoscalerMetrics) -> dict[str, float]:
    return {
        sample.labels["step"]: sample.value
        for family in metrics.registry.collect()
        if family.name == "llmfleet_autoscaler_start_seconds"
        for sample in family.samples
    }


class FakeInformer:
    """An informer that is started by hand and whose first LIST comes when a test says."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.started = False
        self.synced_at: float | None = None

    def start(self) -> None:
        self.started = True


def kube() -> tuple[Kube, list[FakeInformer]]:
    made: list[FakeInformer] = []

    def informer(what: str, call: Any, transform: Any = None) -> FakeInformer:
        made.append(FakeInformer(what))
        return made[-1]

    return Kube(client.ApiClient(), [], "test", informer=informer), made


def test_the_services_and_pods_watches_start_together_and_are_listed_at_the_later_list() -> None:
    found, made = kube()
    assert found.synced_at() is None  # nothing started
    found.start()
    assert [(i.what, i.started) for i in made] == [("inferenceservices", True), ("pods", True)]
    assert found.synced_at() is None  # started, not listed
    now = time.monotonic()
    made[0].synced_at = now
    assert found.synced_at() is None  # the pods' LIST is not in yet
    made[1].synced_at = now + 1.5
    assert found.synced_at() == now + 1.5


def test_a_full_pass_notes_the_first_pass_and_the_lists_once() -> None:
    metrics = AutoscalerMetrics()
    found, made = kube()
    found.start()
    note_start(metrics, found)  # the LISTs' times not known: only the pass
    assert set(steps(metrics)) == {"first_pass"}
    first_pass = steps(metrics)["first_pass"]
    for informer in made:
        informer.synced_at = time.monotonic() - 0.5
    note_start(metrics, found)
    after = steps(metrics)
    assert after["first_pass"] == first_pass
    assert after["listed"] < first_pass + 0.5
    made[0].synced_at = time.monotonic() + 10
    note_start(metrics, found)
    assert steps(metrics)["listed"] == after["listed"]
