"""What an autoscaler sees at a tick: the pool's signals measured the way production measures
them (`autoscaler/signals.py`), from the simulated engines' records.

- `request_rate`, `prompt_tokens_rate`: finished requests and prefilled prompt tokens over the
  last `rate_window_s` (PromQL `rate(vllm:request_success_total[1m])`,
  `rate(vllm:prompt_tokens_total[1m])`); `arrival_rate` and the arrival means are the gateway's
  (frontend's) own counts over the same window;
- `mean_prompt_tokens`, `mean_output_tokens`: over requests finished in `mean_window_s` (5m);
- `running`, `waiting`: sums over the pool's engines now; `kv_cache_usage`: mean over busy
  engines (as the production query does, so spares do not dilute it);
- `peak_prompt_tokens_rate`: prefilled prompt tokens/s of the busiest tick-long slice of the
  rate window (PromQL `max_over_time(rate(vllm:prompt_tokens_total[15s])[1m:15s])`);
- `ttft_p95_ms`, `itl_p95_ms`: exact 95th percentiles over the rate window (Prometheus would
  interpolate inside histogram buckets); None when nothing was measured in it;
- `ttft_histogram`, `itl_histogram`: the window's first tokens by TTFT and its finished requests
  by their mean token gap, in vLLM's own buckets (`TTFT_BUCKETS`, `TPOT_BUCKETS`), so the policy's
  goodput sees the resolution production sees;
- `prefill_histogram`: the window's finished requests by their prefill phase (admission to first
  token), in the bounds of `vllm:request_prefill_time_seconds` (`PREFILL_BUCKETS`), observed at
  the finish as vLLM observes it.

The windows are cut at tick boundaries: `Meter.mark(now)` at every tick remembers how long each
record list was, so a window is a slice, never a scan.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from llmfleet.autoscaler.goodput import LatencyHistogram
from llmfleet.autoscaler.sim.engine import Recorder
from llmfleet.autoscaler.sim.fleet import Pod, PodState, Pool

TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
"""`vllm:time_to_first_token_seconds`' bounds (vLLM `vllm/v1/metrics/loggers.py`; the same in
llm-d-inference-sim v0.10.2's /metrics)."""
TPOT_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
)  # fmt: skip
"""`vllm:request_time_per_output_token_seconds`' bounds (vLLM `vllm/v1/metrics/loggers.py`, as
its `time_per_output_token_seconds`; llm-d-inference-sim v0.10.2 exports the same)."""
PREFILL_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
"""`vllm:request_prefill_time_seconds`' bounds: vLLM's request-latency buckets, shared by its
e2e, queue, prefill and decode time histograms (`vllm/v1/metrics/loggers.py`)."""


@dataclass(frozen=True)
class PodView:
    waiting: int
    running: int
    kv_usage: float
    name: str = ""
    """The pod's name (a Prometheus series' `pod` label); "" where a test leaves it out."""


@dataclass(frozen=True)
class Observation:
    now: float
    request_rate: float
    prompt_tokens_rate: float
    mean_prompt_tokens: float
    mean_output_tokens: float
    arrival_rate: float
    arrival_prompt_tokens: float
    """Mean prompt tokens of the requests that arrived in the rate window (0 when none)."""
    arrival_output_tokens: float
    running: float
    waiting: float
    kv_cache_usage: float
    ttft_p95_ms: float | None
    itl_p95_ms: float | None
    peak_prompt_tokens_rate: float
    """Highest prefilled prompt tokens/s over one tick-long slice of the rate window."""
    active: int
    """Serving replicas the pool runs towards (the last decision)."""
    spares: int
    ready: int
    """Pods serving now."""
    starting: int
    pods: tuple[PodView, ...]
    """One per pod that takes traffic or finishes it (serving, promoting, draining)."""
    ttft_histogram: LatencyHistogram | None = None
    itl_histogram: LatencyHistogram | None = None
    prefill_histogram: LatencyHistogram | None = None
    ready_spares: int = 0
    """Loaded pods out of traffic (spares, draining ones): what a promotion puts into service
    (`PoolPods.ready_spares`)."""
    ttft_mean_ms: float | None = None
    """Mean TTFT over the rate window (Dynamo's planner reads averages); None when none."""
    itl_mean_ms: float | None = None


def weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The q-quantile of `values` each counted `weights` times (lower value at a tie)."""
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(weights[order])
    index = int(np.searchsorted(cumulative, q * cumulative[-1], side="left"))
    return float(values[order][min(index, len(order) - 1)])


class Meter:
    def __init__(self, recorder: Recorder, *, rate_window_s: float, mean_window_s: float) -> None:
        self.recorder = recorder
        self.rate_window_s = rate_window_s
        self.mean_window_s = mean_window_s
        self._times: list[float] = [0.0]
        self._marks: list[tuple[int, int, int, int, int]] = [(0, 0, 0, 0, 0)]

    def mark(self, now: float) -> None:
        r = self.recorder
        self._times.append(now)
        self._marks.append(
            (
                len(r.itl_time),
                len(r.first_time),
                len(r.done_time),
                len(r.prefill_time),
                len(r.arrival_time),
            )
        )

    def _since(self, start: float) -> tuple[float, tuple[int, int, int, int, int]]:
        i = bisect.bisect_left(self._times, start - 1e-9)
        i = min(i, len(self._times) - 1)
        return self._times[i], self._marks[i]

    def observe(self, now: float, pool: Pool) -> Observation:
        """Signals at `now` (call `mark(now)` first)."""
        r = self.recorder
        since, (itl0, first0, done0, prefill0, arrival0) = self._since(now - self.rate_window_s)
        span = max(now - since, 1e-9)
        _, (_, _, done_mean0, _, _) = self._since(now - self.mean_window_s)
        done = len(r.done_time) - done0
        prompt_rate = sum(r.prefill_tokens[prefill0:]) / span
        finished = len(r.done_time) - done_mean0
        mean_prompt = sum(r.done_prompt[done_mean0:]) / finished if finished else 0.0
        mean_output = sum(r.done_output[done_mean0:]) / finished if finished else 0.0
        arrived = len(r.arrival_time) - arrival0
        arrival_prompt = sum(r.arrival_prompt[arrival0:]) / arrived if arrived else 0.0
        arrival_output = sum(r.arrival_output[arrival0:]) / arrived if arrived else 0.0
        # The peak: the busiest tick-long slice of the window (Prometheus: max_over_time of a
        # short rate, `signals.py`).
        peak = 0.0
        first = bisect.bisect_left(self._times, since - 1e-9)
        for j in range(first + 1, len(self._times)):
            lo, hi = self._marks[j - 1][3], self._marks[j][3]
            slice_s = max(self._times[j] - self._times[j - 1], 1e-9)
            peak = max(peak, sum(r.prefill_tokens[lo:hi]) / slice_s)
        ttfts = r.first_ttft[first0:]
        ttft_p95 = float(np.percentile(ttfts, 95)) * 1000.0 if ttfts else None
        itl_p95 = None
        if len(r.itl_value) > itl0:
            itl_p95 = 1000.0 * weighted_quantile(
                np.asarray(r.itl_value[itl0:]), np.asarray(r.itl_weight[itl0:]), 0.95
            )
        ttft_histogram = LatencyHistogram.of(ttfts, TTFT_BUCKETS)
        itl_histogram = LatencyHistogram.of(r.done_tpot[done0:], TPOT_BUCKETS)
        prefill_histogram = LatencyHistogram.of(r.done_prefill[done0:], PREFILL_BUCKETS)
        traffic = [
            p
            for p in pool.pods
            if p.state in (PodState.SERVING, PodState.PROMOTING, PodState.DRAINING)
        ]
        busy = [p for p in pool.pods if p.engine.busy or p.engine.kv_used > 0]
        kv = sum(p.engine.kv_usage for p in busy) / len(busy) if busy else 0.0
        return Observation(
            now=now,
            request_rate=done / span,
            prompt_tokens_rate=prompt_rate,
            mean_prompt_tokens=mean_prompt,
            mean_output_tokens=mean_output,
            arrival_rate=arrived / span,
            arrival_prompt_tokens=arrival_prompt,
            arrival_output_tokens=arrival_output,
            running=float(sum(len(p.engine.running) for p in traffic)),
            waiting=float(sum(len(p.engine.waiting) for p in traffic)),
            kv_cache_usage=kv,
            ttft_p95_ms=ttft_p95,
            itl_p95_ms=itl_p95,
            peak_prompt_tokens_rate=peak,
            active=pool.active,
            spares=pool.spares,
            ready=pool.count(PodState.SERVING),
            starting=pool.count(PodState.STARTING),
            ready_spares=pool.count(PodState.SPARE) + pool.count(PodState.DRAINING),
            pods=tuple(_view(p) for p in traffic),
            ttft_histogram=ttft_histogram,
            itl_histogram=itl_histogram,
            prefill_histogram=prefill_histogram,
            ttft_mean_ms=1000.0 * sum(ttfts) / len(ttfts) if ttfts else None,
            itl_mean_ms=_weighted_mean_ms(r.itl_value[itl0:], r.itl_weight[itl0:]),
        )


def _weighted_mean_ms(values: list[float], weights: list[int]) -> float | None:
    total = sum(weights)
    return (
        1000.0 * sum(v * w for v, w in zip(values, weights, strict=True)) / total if total else None
    )


def _view(pod: Pod) -> PodView:
    return PodView(len(pod.engine.waiting), len(pod.engine.running), pod.engine.kv_usage, pod.name)
