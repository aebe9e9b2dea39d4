"""A pool of pods as the operator runs it: `active + spares` pods, the first `active` ready
ones serving, the rest warm spares.

Pod states: STARTING (holds its GPU, not loaded yet: `cold_start_s`) -> SPARE (loaded, out of
traffic) -> PROMOTING (labelled serving, reachable after `promote_s`) -> SERVING -> DRAINING (out
of traffic, finishing its requests) -> SPARE, or gone when it was marked for deletion.

`reconcile(now)` is level-based like the operator's: it makes the pod count `active + spares`
(removing surplus pods starting first, then spares, then the least busy serving ones, which
drain), then promotes spares or demotes serving pods until `active` serve. A pool without spares
(every baseline) therefore cold-starts a pod for each scale-up, and that pod serves
`promote_s` after it is ready, the time its endpoint takes to reach the router.

GPU-seconds count every pod that exists, whatever its state: a starting pod and a spare hold
their GPU as much as a serving one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from llmfleet.autoscaler.sim.engine import Engine, Recorder
from llmfleet.autoscaler.sim.model import EngineModel


class PodState(Enum):
    STARTING = "starting"
    SPARE = "spare"
    PROMOTING = "promoting"
    SERVING = "serving"
    DRAINING = "draining"


@dataclass(eq=False)
class Pod:
    name: str
    engine: Engine
    state: PodState
    ready_at: float
    """When STARTING ends (loaded) or PROMOTING ends (reachable)."""
    delete: bool = False
    """Marked for deletion: it goes once it has drained."""


class Pool:
    def __init__(
        self,
        model: EngineModel,
        recorder: Recorder,
        *,
        prefix_cache: bool,
        active: int,
        spares: int,
    ) -> None:
        self.model = model
        self.recorder = recorder
        self.prefix_cache = prefix_cache
        self.pods: list[Pod] = []
        self.active = active
        self.spares = spares
        self.gpu_seconds = 0.0
        self.scale_events = 0
        self.created = 0
        self._accounted_at = 0.0
        self._serial = 0
        for _ in range(active):
            self._new(0.0, PodState.SERVING)
        for _ in range(spares):
            self._new(0.0, PodState.SPARE)
        self.on_serving: Callable[[float], None] = lambda _now: None
        """Called when a pod starts serving (the gateway flushes what it held back)."""
        self.serving_log: list[tuple[float, int]] = [(0.0, active)]
        """(time, pods serving) at every change: when capacity arrived, to the event."""

    # -- queries -----------------------------------------------------------------------------

    def serving(self) -> list[Pod]:
        return [p for p in self.pods if p.state is PodState.SERVING]

    def busy_engines(self) -> list[Engine]:
        return [p.engine for p in self.pods if p.engine.busy]

    def count(self, state: PodState) -> int:
        return sum(1 for p in self.pods if p.state is state)

    def next_event(self) -> float:
        """The next time a pod finishes starting or promoting (inf when none does)."""
        times = [
            p.ready_at for p in self.pods if p.state in (PodState.STARTING, PodState.PROMOTING)
        ]
        return min(times, default=float("inf"))

    # -- changes -----------------------------------------------------------------------------

    def account(self, now: float) -> None:
        if now > self._accounted_at:
            self.gpu_seconds += (
                (now - self._accounted_at) * len(self.pods) * self.model.gpus_per_pod
            )
            self._accounted_at = now

    def set_target(self, active: int, spares: int, now: float) -> None:
        if active != self.active:
            self.scale_events += 1
        self.active, self.spares = active, spares
        self.reconcile(now)

    def reconcile(self, now: float) -> None:
        self.account(now)
        newly_serving = self._transitions(now)
        live = [p for p in self.pods if not p.delete]
        want = self.active + self.spares
        for _ in range(want - len(live)):
            self._new(now, PodState.STARTING)
        surplus = len(live) - want
        if surplus > 0:
            self._remove(surplus)
        newly_serving |= self._label(now)
        serving = self.count(PodState.SERVING)
        if serving != self.serving_log[-1][1]:
            self.serving_log.append((now, serving))
        if newly_serving:
            self.on_serving(now)

    def _transitions(self, now: float) -> bool:
        newly_serving = False
        for pod in list(self.pods):
            if pod.state is PodState.STARTING and pod.ready_at <= now:
                pod.state = PodState.SPARE
            elif pod.state is PodState.PROMOTING and pod.ready_at <= now:
                pod.state = PodState.SERVING
                newly_serving = True
            elif pod.state is PodState.DRAINING and not pod.engine.busy:
                if pod.delete:
                    self.pods.remove(pod)
                else:
                    pod.state = PodState.SPARE
        return newly_serving

    def _remove(self, surplus: int) -> None:
        order = (
            [p for p in reversed(self.pods) if p.state is PodState.STARTING and not p.delete]
            + [p for p in self.pods if p.state is PodState.SPARE and not p.delete]
            + [p for p in self.pods if p.state is PodState.DRAINING and not p.delete]
            + [p for p in self.pods if p.state is PodState.PROMOTING and not p.delete]
            + sorted(
                (p for p in self.pods if p.state is PodState.SERVING and not p.delete),
                key=lambda p: p.engine.in_flight,
            )
        )
        for pod in order[:surplus]:
            if pod.engine.busy:
                pod.state = PodState.DRAINING
                pod.delete = True
            else:
                self.pods.remove(pod)

    def _label(self, now: float) -> bool:
        """Promote or demote until `active` pods serve (or are promoting)."""
        live = [p for p in self.pods if not p.delete]
        serving = [p for p in live if p.state in (PodState.SERVING, PodState.PROMOTING)]
        missing = self.active - len(serving)
        became_serving = False
        if missing > 0:
            # Draining pods first: they are warm and were in traffic a moment ago.
            candidates = [p for p in live if p.state is PodState.DRAINING] + [
                p for p in live if p.state is PodState.SPARE
            ]
            for pod in candidates[:missing]:
                pod.state = PodState.PROMOTING
                pod.ready_at = now + self.model.promote_s
                if self.model.promote_s <= 0:
                    pod.state = PodState.SERVING
                    became_serving = True
        elif missing < 0:
            extra = sorted(serving, key=lambda p: (p.state is PodState.SERVING, p.engine.in_flight))
            for pod in extra[:-missing]:
                pod.state = PodState.DRAINING if pod.engine.busy else PodState.SPARE
        return became_serving

    def _new(self, now: float, state: PodState) -> None:
        self._serial += 1
        self.created += 1
        engine = Engine(self.model, self.recorder, prefix_cache=self.prefix_cache)
        engine.clock = now
        ready = now + self.model.cold_start_s if state is PodState.STARTING else now
        self.pods.append(Pod(f"pod-{self._serial}", engine, state, ready))
