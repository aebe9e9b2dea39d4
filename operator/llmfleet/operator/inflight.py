"""How many requests a draining engine still has, read from its vLLM metrics.

Only demoted pods are probed (a handful at a time), with a short timeout: an engine that does
not answer counts as unknown, and the pod then drains for the whole drain period.
"""

from __future__ import annotations

import urllib.error
import urllib.request

from llmfleet.core.loopback import LoopbackGuard

IN_FLIGHT_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")


def parse_in_flight(metrics: str) -> int | None:
    """Sum of running and waiting requests over all label sets; None if neither gauge is there."""
    total, seen = 0.0, False
    for line in metrics.splitlines():
        if line.startswith(IN_FLIGHT_GAUGES):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in IN_FLIGHT_GAUGES:
                total += float(line.rsplit(" ", 1)[1])
                seen = True
    return round(total) if seen else None


def probe_in_flight(
    host: str, port: int, timeout: float = 0.5, guard: LoopbackGuard | None = None
) -> int | None:
    """GET http://host:port/metrics and count in-flight requests; None when it cannot tell
    (also when `guard` refuses the address: it is then never contacted)."""
    try:
        if guard is not None:
            guard.check(host, port, "probe")
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=timeout) as reply:
            return parse_in_flight(reply.read().decode("utf-8", "replace"))
    except (OSError, urllib.error.URLError, ValueError):
        return None
