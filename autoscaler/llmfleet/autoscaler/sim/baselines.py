"""Baseline autoscalers modelled on the systems we compare with, each with its published
parameters. All act on the same simulated signals as our policy, through the same pool (no warm
spares: each scale-up cold-starts a pod), start at the same size and share `max_replicas`.

- `StaticPeak`: a fixed fleet sized for the trace's busiest minute (what a team without an
  autoscaler provisions), with the same sizing functions our policy uses.
- `KedaQueue`: KEDA ScaledObject with a Prometheus trigger on `sum(vllm:num_requests_waiting)`,
  threshold 5, pollingInterval 15 s, cooldown 300 s (vLLM production-stack tutorial
  "Autoscaling with KEDA", `docs/source/use_cases/autoscaling-keda.rst`). KEDA hands the value to
  the HPA as an AverageValue target: desired = ceil(total / threshold), inside the HPA's 10 %
  tolerance nothing changes; scale-up at most max(4 pods, 100 %) per 15 s and scale-down to the
  highest recommendation of the last 300 s (HPA `behavior` defaults, Kubernetes docs).
- `LlmdSloRatio`: llm-d-style SLO ratio r = max(TTFT p95 / target, ITL p95 / target): above 0.55
  scale up in proportion (ceil(n x r / 0.55)), below 0.40 step down by one, between hold; applied
  through the HPA, so scale-down waits the HPA's 300 s stabilisation (thresholds as issue 6
  states them for llm-d).
- `DynamoPlanner`: NVIDIA Dynamo's throughput-based SLA planner: every adjustment interval of
  180 s, predict the next interval's load as the last one's (the "constant" predictor), then
  prefill replicas = rate x ISL / (profiled prefill tok/s per GPU) and decode replicas =
  rate x OSL / (profiled output tok/s per GPU at the ITL target), the larger for a unified pool
  (Dynamo docs, "Planner" / SLA planner, `adjustment-interval` 180 s default).
- `AibrixKpa`: AIBrix's Knative-style KPA on `num_requests_running` with target 5 per pod (the
  AIBrix autoscaling example), stable window 180 s, panic window 60 s, panic threshold 2x
  (200 %): desired = ceil(window average / target); panic starts when the panic window's desired
  count reaches 2x the ready pods, then the pool never shrinks until a stable window passes
  without panic; scale-down at most halves the pool per tick (Knative `max-scale-down-rate` 2).
"""

from __future__ import annotations

import math
from collections import deque

from llmfleet.autoscaler.sim.observe import Observation
from llmfleet.core.capacity_profile import CapacityProfile

_HPA_TOLERANCE = 0.1
_HPA_DOWN_WINDOW_S = 300.0
_HPA_UP_PODS = 4


def _clamp(value: int, minimum: int, maximum: int) -> int:
    return max(minimum, min(value, maximum))


class _HpaBehaviour:
    """The HPA's default scale-up rate limit and scale-down stabilisation."""

    def __init__(self, down_window_s: float = _HPA_DOWN_WINDOW_S) -> None:
        self.down_window_s = down_window_s
        self._recommendations: deque[tuple[float, int]] = deque()

    def apply(self, now: float, current: int, desired: int) -> int:
        self._recommendations.append((now, desired))
        while self._recommendations and self._recommendations[0][0] < now - self.down_window_s:
            self._recommendations.popleft()
        if desired > current:
            return min(desired, current + max(_HPA_UP_PODS, current))
        stabilised = max(r for _, r in self._recommendations)
        return min(current, stabilised)


class StaticPeak:
    name = "static-peak"

    def __init__(self, replicas: int) -> None:
        self.replicas = replicas

    def start(self) -> tuple[int, int]:
        return self.replicas, 0

    def decide(self, observation: Observation) -> tuple[int, int]:
        return self.replicas, 0


class KedaQueue:
    name = "keda-queue"

    def __init__(
        self,
        initial: int,
        *,
        threshold: float = 5.0,
        polling_s: float = 15.0,
        cooldown_s: float = 300.0,
        min_replicas: int = 1,
        max_replicas: int = 64,
    ) -> None:
        self.initial = initial
        self.threshold = threshold
        self.polling_s = polling_s
        self.min_replicas, self.max_replicas = min_replicas, max_replicas
        self.hpa = _HpaBehaviour(cooldown_s)
        self._current = initial
        self._last = -math.inf

    def start(self) -> tuple[int, int]:
        return self.initial, 0

    def decide(self, observation: Observation) -> tuple[int, int]:
        if observation.now - self._last < self.polling_s - 1e-9:
            return self._current, 0
        self._last = observation.now
        current = max(observation.active, 1)
        ratio = observation.waiting / (self.threshold * current)
        if abs(ratio - 1.0) <= _HPA_TOLERANCE:
            desired = current
        else:
            desired = math.ceil(observation.waiting / self.threshold)
        desired = _clamp(desired, self.min_replicas, self.max_replicas)
        self._current = _clamp(
            self.hpa.apply(observation.now, current, desired), self.min_replicas, self.max_replicas
        )
        return self._current, 0


class LlmdSloRatio:
    name = "llm-d-slo"

    def __init__(
        self,
        initial: int,
        *,
        ttft_ms: float,
        itl_ms: float,
        up_above: float = 0.55,
        down_below: float = 0.40,
        min_replicas: int = 1,
        max_replicas: int = 64,
    ) -> None:
        self.initial = initial
        self.ttft_ms, self.itl_ms = ttft_ms, itl_ms
        self.up_above, self.down_below = up_above, down_below
        self.min_replicas, self.max_replicas = min_replicas, max_replicas
        self.hpa = _HpaBehaviour()

    def start(self) -> tuple[int, int]:
        return self.initial, 0

    def ratio(self, observation: Observation) -> float | None:
        parts = [
            observed / target
            for observed, target in (
                (observation.ttft_p95_ms, self.ttft_ms),
                (observation.itl_p95_ms, self.itl_ms),
            )
            if observed is not None
        ]
        return max(parts) if parts else None

    def decide(self, observation: Observation) -> tuple[int, int]:
        current = max(observation.active, 1)
        ratio = self.ratio(observation)
        if ratio is None:
            desired = current if observation.running + observation.waiting else current - 1
        elif ratio > self.up_above:
            desired = math.ceil(current * ratio / self.up_above)
        elif ratio < self.down_below:
            desired = current - 1
        else:
            desired = current
        desired = _clamp(desired, self.min_replicas, self.max_replicas)
        result = self.hpa.apply(observation.now, current, desired)
        return _clamp(result, self.min_replicas, self.max_replicas), 0


class DynamoPlanner:
    name = "dynamo-planner"

    def __init__(
        self,
        initial: int,
        profile: CapacityProfile,
        *,
        itl_ms: float,
        interval_s: float = 180.0,
        min_replicas: int = 1,
        max_replicas: int = 64,
    ) -> None:
        self.initial = initial
        self.interval_s = interval_s
        self.prefill_tps = profile.prefill_tokens_per_second or 1.0
        within = [p for p in profile.itl if p.p95_ms <= itl_ms]
        best = max(within, key=lambda p: p.output_tokens_per_second) if within else profile.itl[0]
        self.decode_tps = best.output_tokens_per_second
        self.min_replicas, self.max_replicas = min_replicas, max_replicas
        self._current = initial
        self._next = interval_s
        self._samples: list[tuple[float, float, float]] = []

    def start(self) -> tuple[int, int]:
        return self.initial, 0

    def decide(self, observation: Observation) -> tuple[int, int]:
        self._samples.append(
            (
                observation.arrival_rate,
                observation.arrival_rate * observation.arrival_prompt_tokens,
                observation.arrival_rate * observation.arrival_output_tokens,
            )
        )
        if observation.now + 1e-9 < self._next:
            return self._current, 0
        self._next += self.interval_s
        count = len(self._samples)
        prompt_rate = sum(s[1] for s in self._samples) / count
        output_rate = sum(s[2] for s in self._samples) / count
        self._samples.clear()
        prefill = math.ceil(prompt_rate / self.prefill_tps)
        decode = math.ceil(output_rate / self.decode_tps)
        self._current = _clamp(max(prefill, decode), self.min_replicas, self.max_replicas)
        return self._current, 0


class AibrixKpa:
    name = "aibrix-kpa"

    def __init__(
        self,
        initial: int,
        *,
        target: float = 5.0,
        stable_window_s: float = 180.0,
        panic_window_s: float = 60.0,
        panic_threshold: float = 2.0,
        max_scale_down_rate: float = 2.0,
        min_replicas: int = 1,
        max_replicas: int = 64,
    ) -> None:
        self.initial = initial
        self.target = target
        self.stable_window_s, self.panic_window_s = stable_window_s, panic_window_s
        self.panic_threshold = panic_threshold
        self.max_scale_down_rate = max_scale_down_rate
        self.min_replicas, self.max_replicas = min_replicas, max_replicas
        self._samples: deque[tuple[float, float]] = deque()
        self._panic_since: float | None = None

    def start(self) -> tuple[int, int]:
        return self.initial, 0

    def _average(self, now: float, window: float) -> float:
        values = [v for t, v in self._samples if t > now - window]
        return sum(values) / len(values) if values else 0.0

    def decide(self, observation: Observation) -> tuple[int, int]:
        now = observation.now
        self._samples.append((now, observation.running))
        while self._samples and self._samples[0][0] <= now - self.stable_window_s:
            self._samples.popleft()
        current = max(observation.active, 1)
        ready = max(observation.ready, 1)
        stable = math.ceil(self._average(now, self.stable_window_s) / self.target)
        panic = math.ceil(self._average(now, self.panic_window_s) / self.target)
        if panic / ready >= self.panic_threshold:
            self._panic_since = now
        elif self._panic_since is not None and now - self._panic_since >= self.stable_window_s:
            self._panic_since = None
        if self._panic_since is not None:
            desired = max(panic, current)
        else:
            desired = max(stable, math.ceil(current / self.max_scale_down_rate))
        return _clamp(desired, self.min_replicas, self.max_replicas), 0
