"""Short-horizon request-rate forecast with burst detection, from two EWMAs.

On a linear ramp r(t) = a + b t an EWMA with time constant tau lags the rate by b x tau, so the
fast average minus the slow one is b x (tau_long - tau_short): the slope, with no model to fit.
The forecast extrapolates a rising slope over the horizon (never a falling one: scale-downs wait
for the stabilisation window instead). A burst is the fast average above `burst_factor` x the
slow one; it also holds scale-downs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from llmfleet.autoscaler.inputs import PolicyConfig, PoolState


@dataclass(frozen=True)
class Forecast:
    rate: float
    """Requests per second expected over the horizon."""
    short_rate: float
    long_rate: float
    burst: bool


def _ewma(previous: float, sample: float, dt: float, tau: float) -> float:
    alpha = 1.0 - math.exp(-dt / tau)
    return previous + alpha * (sample - previous)


def forecast(
    state: PoolState, rate: float, observed_at: datetime, config: PolicyConfig
) -> Forecast:
    """Update the averages with the newest rate and forecast the horizon.

    A pool seen for the first time starts both averages at the current rate (no slope).
    """
    if state.updated_at is None:
        short = long = rate
    else:
        dt = max((observed_at - state.updated_at).total_seconds(), 0.0)
        short = _ewma(state.short_rate, rate, dt, config.short_ewma_s)
        long = _ewma(state.long_rate, rate, dt, config.long_ewma_s)
    slope = max(short - long, 0.0) / (config.long_ewma_s - config.short_ewma_s)
    burst = short > 0.0 and short > config.burst_factor * long
    return Forecast(
        rate=rate + slope * config.horizon_s, short_rate=short, long_rate=long, burst=burst
    )
