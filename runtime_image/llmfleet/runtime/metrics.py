"""Reading the engine's Prometheus text: only the few gauges the drain needs.

vLLM (and llm-d-inference-sim) export one sample per label set (`model_name`, `engine`); the
drain wants the sum over all of them.
"""

from __future__ import annotations

import math
import re

_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+(?P<value>\S+)")

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"


def gauge_sum(text: str, name: str) -> float | None:
    """Sum of every sample of `name`; None when the exposition has none (or only NaN)."""
    total: float | None = None
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or match["name"] != name:
            continue
        try:
            value = float(match["value"])
        except ValueError:
            continue
        if not math.isnan(value):
            total = (total or 0.0) + value
    return total


def requests_in_engine(text: str) -> int | None:
    """Running + waiting requests, or None when the engine exports neither gauge."""
    running, waiting = gauge_sum(text, RUNNING), gauge_sum(text, WAITING)
    if running is None and waiting is None:
        return None
    return int((running or 0) + (waiting or 0))


_LABEL = re.compile(r'(?P<key>[a-zA-Z_][a-zA-Z0-9_]*)="(?P<value>(?:[^"\\]|\\.)*)"')


def labels_of(text: str, name: str) -> dict[str, str] | None:
    """The labels of the first sample of `name` (info metrics carry their data there)."""
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return {m["key"]: m["value"] for m in _LABEL.finditer(line[len(name) :])}
    return None


def kv_cache_tokens(text: str) -> int | None:
    """KV-cache capacity in tokens: `num_gpu_blocks` x `block_size` of `vllm:cache_config_info`."""
    labels = labels_of(text, "vllm:cache_config_info")
    if labels is None:
        return None
    try:
        return int(labels["num_gpu_blocks"]) * int(labels["block_size"])
    except (KeyError, ValueError):
        return None
