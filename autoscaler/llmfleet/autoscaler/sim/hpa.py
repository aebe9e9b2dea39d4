"""The Kubernetes HorizontalPodAutoscaler as the threshold baselines drive it: KEDA creates one
for its ScaledObject; llm-d's WVA publishes a desired-replica metric for one to follow.

- An `AverageValue` target: desired = ceil(total / target), unless total / (target x current)
  is within the tolerance of 1, when nothing changes (`average_value`; Kubernetes docs
  "Horizontal Pod Autoscaling", "Algorithm details": tolerance 0.1, the
  `--horizontal-pod-autoscaler-tolerance` default).
- `behavior` (`Hpa.scale`, Kubernetes `pkg/controller/podautoscaler/horizontal.go`,
  `recordInitialRecommendation`, `stabilizeRecommendationWithBehaviors` and
  `convertDesiredReplicasWithBehaviorRate`): every recommendation is kept, the first being the
  replicas the HPA found when it was created; the replicas move up no further than the lowest
  recommendation of the scale-up stabilisation window and down no further than the highest of
  the scale-down window; then each direction's rate policies cap the change over their period
  (`selectPolicy: Max`: the policy allowing the larger change), counting the changes already
  made in the period.
- `KUBERNETES_DEFAULT`: no scale-up stabilisation, 4 pods or 100 % per 15 s up; 300 s scale-down
  stabilisation, 100 % per 15 s down (docs "Configurable scaling behavior", "Default
  Behavior").
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

TOLERANCE = 0.1
"""`--horizontal-pod-autoscaler-tolerance` default (Kubernetes docs, "Algorithm details")."""


@dataclass(frozen=True)
class Policy:
    kind: str
    """"Pods" or "Percent"."""
    value: float
    period_s: float


@dataclass(frozen=True)
class Behaviour:
    up_window_s: float
    up: tuple[Policy, ...]
    down_window_s: float
    down: tuple[Policy, ...]


KUBERNETES_DEFAULT = Behaviour(
    up_window_s=0.0,
    up=(Policy("Percent", 100, 15), Policy("Pods", 4, 15)),
    down_window_s=300.0,
    down=(Policy("Percent", 100, 15),),
)
"""The `behavior` an HPA gets when it names none (Kubernetes docs, "Default Behavior")."""


def average_value(total: float, target: float, current: int) -> int:
    """Replicas an `AverageValue` target asks for (`current` inside the tolerance)."""
    if abs(total / (target * current) - 1.0) <= TOLERANCE:
        return current
    return math.ceil(total / target)


class Hpa:
    """One HPA's `behavior` between the metric's recommendation and the replicas it sets."""

    def __init__(
        self, behaviour: Behaviour, *, initial: int, min_replicas: int, max_replicas: int
    ) -> None:
        """An HPA created at time 0 over `initial` replicas: like Kubernetes'
        `recordInitialRecommendation`, it starts with that count as its first recommendation."""
        self.behaviour = behaviour
        self.min_replicas, self.max_replicas = min_replicas, max_replicas
        self._recommendations: deque[tuple[float, int]] = deque([(0.0, initial)])
        self._changes: deque[tuple[float, int]] = deque()

    def scale(self, now: float, current: int, recommended: int) -> int:
        """Replicas after one HPA pass at `now` with the metric recommending `recommended`."""
        b = self.behaviour
        self._recommendations.append((now, recommended))
        horizon = max(b.up_window_s, b.down_window_s, *(p.period_s for p in b.up + b.down))
        for log in (self._recommendations, self._changes):
            while log and log[0][0] < now - horizon:
                log.popleft()
        up_floor = min(r for t, r in self._recommendations if t > now - b.up_window_s or t == now)
        down_ceiling = max(
            r for t, r in self._recommendations if t > now - b.down_window_s or t == now
        )
        desired = min(max(current, up_floor), down_ceiling)
        if desired > current:
            desired = min(desired, self._up_limit(now, current))
        elif desired < current:
            desired = max(desired, self._down_limit(now, current))
        desired = max(self.min_replicas, min(desired, self.max_replicas))
        if desired != current:
            self._changes.append((now, desired - current))
        return desired

    def _up_limit(self, now: float, current: int) -> int:
        limits = []
        for policy in self.behaviour.up:
            added = sum(d for t, d in self._changes if d > 0 and t > now - policy.period_s)
            start = current - added
            if policy.kind == "Pods":
                limits.append(start + int(policy.value))
            else:
                limits.append(math.ceil(start * (1 + policy.value / 100)))
        return max(*limits, current)

    def _down_limit(self, now: float, current: int) -> int:
        limits = []
        for policy in self.behaviour.down:
            removed = -sum(d for t, d in self._changes if d < 0 and t > now - policy.period_s)
            start = current + removed
            if policy.kind == "Pods":
                limits.append(start - int(policy.value))
            else:
                limits.append(math.ceil(start * (1 - policy.value / 100)))
        return min(*limits, current)
