"""llm-d's Workload Variant Autoscaler (WVA) as a fleet-simulator baseline, `LlmdWva`.

The mode modelled is WVA's default, the token-based saturation analyzer ("V2"; the default
since WVA v0.9.0, `deploy/configmap-saturation-scaling.yaml` at v0.9.0; its code read at
llm-d/llm-d-workload-variant-autoscaler b08b1c7, `internal/engines/analyzers/saturation_v2/
analyzer.go` and `internal/engines/pipeline/cost_aware_optimizer.go`). Every 60 s, per pod
reporting metrics, from its peaks of the last minute (`max_over_time(...[1m])`,
`internal/collector/registration/saturation.go`):

- demand = KV tokens in use + waiting requests x mean prompt tokens;
- capacity = min(k1, k2): k1 = KV cache tokens x kvCacheThreshold 0.8; k2, the compute-bound
  capacity, is the tokens in use of a pod whose queue reached queueLengthThreshold 5
  (observed), else the mean of the last 10 such observations for the same output-length bucket
  (history), else min(B x O / (I + O), max_num_seqs) x (I + O / 2) from the engine's
  batched-token budget B and the mean prompt I and output O (derived), else k1.

With C the median pod capacity and supply = ready x C, the cost-aware optimizer (one variant
here) adds ceil((demand / scaleUpThreshold - (ready + pending) x C) / C) replicas when that is
positive, else removes floor((supply - demand / scaleDownBoundary) / C), keeping one. The
projection (demand / boundary must fit in the pods that remain) is what lets it settle. WVA
publishes the result as `wva_desired_replicas`; the HPA its Helm chart installs follows it
(`WVA_HPA`, `hpa.py`).

Left out, as this simulation has none of them: the llm-d flow-control queue's demand (the
gateway here queues nothing while a pod serves), other variants and their costs, the GPU
limiter (`enableLimiter: false` by default) and scale to zero.
"""

from __future__ import annotations

import math
from collections import deque

from llmfleet.autoscaler.sim.hpa import Behaviour, Hpa, Policy, average_value
from llmfleet.autoscaler.sim.model import EngineModel
from llmfleet.autoscaler.sim.observe import Observation, PodView

_SCALE_UP, _SCALE_DOWN = 0.5, 0.2
"""scaleUpThreshold and scaleDownBoundary: chosen by the grid search of
`bench/sim_baseline_grid.py` over up {0.5, 0.7, 0.85, 0.95} x down {0.2, 0.3, 0.5, 0.7} (down <
up) on the two public traces, then held fixed (`bench/results/sim/baseline-grid.txt`). None
meets 99 % on Azure: WVA looks once a minute and its chart's HPA waits 240 s before scaling up,
so Azure's bursts (hundreds of requests in 20 s) meet minReplicas 2 whatever the thresholds
(95.41 % for all 13). On Mooncake 0.5/0.2 and 0.5/0.3 reach the most (98.67 %, the same run);
the rule takes the first. WVA's defaults are 0.85 and 0.70
(`internal/interfaces/saturation_scaling.go`, `DefaultScaleUpThreshold`,
`DefaultScaleDownBoundary`): 97.04 % on Mooncake, and on the steady load of
`test_baseline_sanity.py` they step down to one replica, which the load saturates."""
_INTERVAL_S = 60.0
"""WVA's reconcile interval, `GLOBAL_OPT_INTERVAL: "60s"` (`config/manager/configmap.yaml`; the
chart's `wva.reconcileInterval`)."""
_KV_THRESHOLD = 0.80
_QUEUE_THRESHOLD = 5
"""kvCacheThreshold and queueLengthThreshold defaults (`deploy/configmap-saturation-scaling.yaml`,
`docs/saturation-scaling-config.md`)."""
_PEAK_WINDOW_S = 60.0
"""`max_over_time(vllm:kv_cache_usage_perc[1m])` and `max_over_time(vllm:num_requests_waiting[1m])`
per pod (`internal/collector/registration/saturation.go`)."""
_HISTORY = 10
"""`RollingAverageWindowSize`: observed k2 values kept per bucket
(`internal/engines/analyzers/saturation_v2/constants.go`)."""
_BUCKETS = (100, 500)
"""Mean output tokens below 100 are "short", below 500 "medium", else "long"
(`ShortOutputThreshold`, `MediumOutputThreshold`, same file): k2 history is kept per bucket."""
WVA_HPA = Behaviour(
    up_window_s=240.0,
    up=(Policy("Pods", 10, 150),),
    down_window_s=240.0,
    down=(Policy("Pods", 10, 150),),
)
"""The HPA WVA's Helm chart installs on `wva_desired_replicas` (`AverageValue` 1): 240 s
stabilisation both ways, 10 pods per 150 s (`charts/workload-variant-autoscaler/values.yaml`,
`hpa.behavior`, "Production default")."""


class _PodPeaks:
    """Each pod's highest KV usage and queue over the last window (PromQL `max_over_time` per
    `pod` series): a pod's samples are matched by its name (by its place in the list where an
    observation carries no names, as in the unit tables)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, dict[str, PodView]]] = deque()

    def peaks(self, now: float, pods: tuple[PodView, ...]) -> list[tuple[float, int]]:
        """(KV usage, waiting) peaks of each pod now reporting."""
        named = {pod.name or str(i): pod for i, pod in enumerate(pods)}
        self._samples.append((now, named))
        while self._samples[0][0] <= now - self.window_s:
            self._samples.popleft()
        result: list[tuple[float, int]] = []
        for key, pod in named.items():
            seen = [sample[key] for _, sample in self._samples if key in sample]
            result.append(
                (max(p.kv_usage for p in (pod, *seen)), max(p.waiting for p in (pod, *seen)))
            )
        return result


class LlmdWva:
    name = "llm-d-wva"

    def __init__(
        self,
        initial: int,
        model: EngineModel,
        *,
        scale_up: float = _SCALE_UP,
        scale_down: float = _SCALE_DOWN,
        interval_s: float = _INTERVAL_S,
        hpa: Behaviour = WVA_HPA,
        min_replicas: int = 1,
        max_replicas: int = 64,
    ) -> None:
        self.initial = initial
        self.model = model
        self.scale_up, self.scale_down = scale_up, scale_down
        self.interval_s = interval_s
        self.hpa = Hpa(hpa, initial=initial, min_replicas=min_replicas, max_replicas=max_replicas)
        self._desired = initial
        """The last `wva_desired_replicas` WVA published (the HPA follows it every tick)."""
        self._next = interval_s
        self._peaks = _PodPeaks(_PEAK_WINDOW_S)
        self._history: dict[str, deque[float]] = {}

    def start(self) -> tuple[int, int]:
        return self.initial, 0

    def decide(self, observation: Observation) -> tuple[int, int]:
        peaks = self._peaks.peaks(observation.now, observation.pods)
        if observation.now + 1e-9 >= self._next:
            self._next += self.interval_s
            self._desired = self.desired(observation, peaks)
        current = max(observation.active, 1)
        recommended = average_value(self._desired, 1.0, current)
        return self.hpa.scale(observation.now, current, recommended), 0

    def desired(self, observation: Observation, peaks: list[tuple[float, int]]) -> int:
        """One reconcile: the replicas the saturation analyzer and the cost-aware optimizer
        ask for, from each pod's (KV usage, waiting) peaks."""
        current = observation.active
        if not peaks:
            return current
        prompt, output = observation.mean_prompt_tokens, observation.mean_output_tokens
        capacities, demand = [], 0.0
        for kv_usage, waiting in peaks:
            in_use = kv_usage * self.model.kv_tokens
            demand += in_use + waiting * prompt
            k1 = self.model.kv_tokens * _KV_THRESHOLD
            capacities.append(min(k1, self._k2(in_use, waiting, prompt, output, k1)))
        capacities.sort()
        middle = len(capacities) // 2
        per_pod = (
            capacities[middle]
            if len(capacities) % 2
            else (capacities[middle - 1] + capacities[middle]) / 2
        )
        ready = observation.ready
        pending = max(current - ready, 0)
        required = demand / self.scale_up - (ready + pending) * per_pod
        if required > 0:
            return current + math.ceil(required / per_pod)
        spare = ready * per_pod - demand / self.scale_down
        if spare > 0:
            return current - min(int(spare // per_pod), current - 1)
        return current

    def _k2(self, in_use: float, waiting: int, prompt: float, output: float, k1: float) -> float:
        """Compute-bound capacity in tokens: observed, else history, else derived, else k1."""
        short, medium = _BUCKETS
        bucket = "short" if output < short else "medium" if output < medium else "long"
        history = self._history.setdefault(bucket, deque(maxlen=_HISTORY))
        if waiting >= _QUEUE_THRESHOLD and in_use > 0:
            history.append(in_use)
            return in_use
        if history:
            return sum(history) / len(history)
        if output > 0:
            model = self.model
            steady = min(model.max_batched_tokens * output / (prompt + output), model.max_num_seqs)
            return steady * (prompt + output / 2)
        return k1
