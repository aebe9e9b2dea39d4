"""A small in-memory stand-in for the cluster that runs the pure plan pass after pass: children
are stored as applied, each Deployment's pods follow its replicas (new pods start not ready,
as spares, and turn ready `ready_after` seconds later; surplus pods go lowest deletion cost
first), pod changes set labels and annotations, deletions remove a child and a Deployment's
pods, and the status is merge-patched. Enough to walk a rollout through every phase.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from llmfleet.crds import Condition, InferenceService
from llmfleet.crds import labels as L
from llmfleet.operator.observed import Observed, ObservedChild, ObservedPod, rollout_status
from llmfleet.operator.plan import Plan, desired
from llmfleet.operator.rollout import Analysis
from llmfleet.operator.settings import OperatorSettings


def merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """JSON merge patch (RFC 7386) of `patch` into `target`."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


@dataclass
class World:
    service: InferenceService
    settings: OperatorSettings
    now: datetime
    ready_after: float = 4.0
    children: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    pods: dict[str, ObservedPod] = field(default_factory=dict)
    status: dict[str, Any] = field(default_factory=dict)
    counter: int = 0
    history: list[Plan] = field(default_factory=list)

    def observed(self, analysis: Analysis | None = None) -> Observed:
        found = []
        for (kind, name), manifest in self.children.items():
            meta = manifest["metadata"]
            found.append(ObservedChild(
                api_version=manifest["apiVersion"], kind=kind, namespace=meta["namespace"],
                name=name, uid=f"uid-{name}", labels=dict(meta.get("labels") or {}),
                controller_uid=meta["ownerReferences"][0]["uid"],
                data=dict(manifest.get("data") or {}),
            ))  # fmt: skip
        ready = [
            replace(pod, ready=pod.ready or (self.now - pod.created).total_seconds()
                    >= self.ready_after)
            for pod in self.pods.values()
        ]  # fmt: skip
        self.pods = {pod.name: pod for pod in ready}
        return Observed(
            pods=tuple(ready),
            children=tuple(found),
            conditions=tuple(
                Condition.model_validate(c) for c in self.status.get("conditions", [])
            ),
            analysis=analysis,
            **rollout_status(self.status),
        )

    def deployment_pods(self, name: str) -> list[ObservedPod]:
        """A Deployment's pods: by `llmfleet.dev/deployment`, else the pool's own."""
        service = str(self.service.metadata["name"])
        return [
            pod for pod in self.pods.values()
            if (pod.deployment or L.pool_service_name(service, pod.pool)) == name
        ]  # fmt: skip

    def step(self, analysis: Analysis | None = None, seconds: float = 2.0) -> Plan:
        """One pass at `now`, its plan carried out, then the clock moves on."""
        plan = desired(self.service, self.observed(analysis), self.settings, self.now)
        self.history.append(plan)
        for manifest in plan.objects:
            self.children[(manifest["kind"], manifest["metadata"]["name"])] = manifest
        for change in plan.pod_changes:
            pod = self.pods.get(change.name)
            if pod is not None:
                self.pods[change.name] = replace(
                    pod, serving=change.serving, serving_value=change.serving_value,
                    demoted_at=change.demoted_at, deletion_cost=change.deletion_cost,
                    in_flight=0 if change.demoted_at else None,
                )  # fmt: skip
        for child in plan.deletions:
            self.children.pop((child.kind, child.name), None)
            if child.kind == "Deployment":
                for pod in self.deployment_pods(child.name):
                    del self.pods[pod.name]
        for (kind, name), manifest in self.children.items():
            if kind == "Deployment":
                self._scale(name, manifest)
        merge(self.status, plan.status)
        self.now += timedelta(seconds=seconds)
        return plan

    def _scale(self, name: str, manifest: dict[str, Any]) -> None:
        pods = self.deployment_pods(name)
        wanted = manifest["spec"]["replicas"]
        labels = manifest["spec"]["template"]["metadata"]["labels"]
        for _ in range(wanted - len(pods)):
            self.counter += 1
            pod = ObservedPod(
                name=f"{name}-{self.counter}", pool=labels[L.POOL], created=self.now,
                ready=False, serving=False, deployment=labels.get(L.DEPLOYMENT),
            )  # fmt: skip
            self.pods[pod.name] = pod
        surplus = sorted(pods, key=lambda p: (p.deletion_cost or 0, p.ready))[
            : max(0, len(pods) - wanted)
        ]
        for pod in surplus:
            del self.pods[pod.name]

    def serving(self, name: str, value: str = "true") -> int:
        return sum(
            1 for pod in self.deployment_pods(name)
            if pod.ready and pod.serving and pod.serving_value == value
        )  # fmt: skip

    def condition(self, kind: str) -> dict[str, Any]:
        return next(c for c in self.status["conditions"] if c["type"] == kind)
