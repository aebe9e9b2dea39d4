"""What a component's start took, step by step, counted from its process's start: the figure a
restart is judged by (issue 28: "each component restarted, time until it acts again").

`StartSteps` sets a gauge `<component>_start_seconds{step}` once per step, at the first time
the step is reached; a step not reached has no sample. The start is the process's own, read
from /proc (`process_start`), so the interpreter's start and the imports count. The operator
and the autoscaler use it with the steps `serving` (their /metrics served), `listed` (their
watches' first LISTs in memory) and `first_pass`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from prometheus_client import Gauge


def process_start() -> float:
    """When this process started, on `time.monotonic()`'s clock: from its start time in /proc,
    so the interpreter's start and the imports count (10 ms steps); where there is no /proc,
    now."""
    now = time.monotonic()
    try:
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        stat = Path("/proc/self/stat").read_text()
    except OSError:
        return now
    # Field 22 of stat, the start in clock ticks since boot; the command name (field 2, in
    # parentheses) may hold spaces, so fields are counted after its closing parenthesis.
    started = int(stat.rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
    return now - (uptime - started)


class StartSteps:
    """Sets `gauge` (labelled by `step`) to the seconds from the process's start to each step,
    the first time it is reached."""

    def __init__(self, gauge: Gauge) -> None:
        self._gauge = gauge
        self._process_start = process_start()
        self._reached: set[str] = set()

    def reached(self, step: str, at: float | None = None) -> None:
        """The start reached `step` at `at` (`time.monotonic()`; now when None). Only the first
        time counts: a later call for the same step changes nothing."""
        if step in self._reached:
            return
        self._reached.add(step)
        seconds = (time.monotonic() if at is None else at) - self._process_start
        self._gauge.labels(step).set(max(seconds, 0.0))

    def has_reached(self, step: str) -> bool:
        return step in self._reached
