"""How many requests a draining engine still has, read from its vLLM metrics.

Only demoted pods are probed (a handful at a time), with a short timeout: an engine that does
not answer counts as unknown, and the pod then drains for the whole drain period.
"""

from __future__ import annotations

import urllib.error
import urllib.request

from llmfleet.core import vllm_metrics
from llmfleet.core.loopback import LoopbackGuard


def probe_in_flight(
    host: str, port: int, timeout: float = 0.5, guard: LoopbackGuard | None = None
) -> int | None:
    """GET http://host:port/metrics and count in-flight requests; None when it cannot tell
    (also when `guard` refuses the address: it is then never contacted)."""
    try:
        if guard is not None:
            guard.check(host, port, "probe")
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=timeout) as reply:
            return vllm_metrics.requests_in_engine(reply.read().decode("utf-8", "replace"))
    except (OSError, urllib.error.URLError, ValueError):
        return None
