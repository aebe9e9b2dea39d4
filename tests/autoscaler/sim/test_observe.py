"""The simulator's signals: the peak prompt-token rate is the busiest tick-long slice of the
rate window, as `signals.py` asks Prometheus for it."""

from __future__ import annotations

import pytest

from llmfleet.autoscaler.sim.engine import Recorder
from llmfleet.autoscaler.sim.fleet import Pool
from llmfleet.autoscaler.sim.model import EngineModel
from llmfleet.autoscaler.sim.observe import Meter


def test_the_peak_is_the_busiest_tick_of_the_window_and_the_mean_hides_it() -> None:
    recorder = Recorder()
    pool = Pool(EngineModel(), recorder, prefix_cache=False, active=1, spares=0)
    meter = Meter(recorder, rate_window_s=60.0, mean_window_s=300.0)
    # Per 15 s tick: 15,000 prompt tokens, then a burst of 150,000, then two quiet ticks, then
    # one more of 15,000 (the burst's tick leaves the 60 s window at t = 90).
    prefilled = {15: 15_000, 30: 150_000, 45: 0, 60: 0, 75: 15_000, 90: 15_000}
    seen = {}
    for tick, tokens in prefilled.items():
        recorder.prefill_time.append(tick - 1.0)
        recorder.prefill_tokens.append(tokens)
        meter.mark(float(tick))
        seen[tick] = meter.observe(float(tick), pool)

    assert seen[60].prompt_tokens_rate == pytest.approx(165_000 / 60)
    assert seen[60].peak_prompt_tokens_rate == pytest.approx(150_000 / 15)
    assert seen[75].peak_prompt_tokens_rate == pytest.approx(10_000)
    assert seen[90].peak_prompt_tokens_rate == pytest.approx(1_000)
