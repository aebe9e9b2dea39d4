"""The engine's /metrics as the launcher reads it (drain, profiler), through core's one parser.

vLLM (and llm-d-inference-sim) export one sample per label set (`model_name`, `engine`); the
drain and the profiler want the sum over all of them.
"""

from __future__ import annotations

from llmfleet.core import vllm_metrics
from llmfleet.core.vllm_metrics import CACHE_CONFIG_INFO, RUNNING, WAITING, requests_in_engine

__all__ = ["RUNNING", "WAITING", "gauge_sum", "kv_cache_tokens", "requests_in_engine"]


def gauge_sum(text: str, name: str) -> float | None:
    """Sum of every sample of `name` (a gauge, or a counter's `_total`); None when the
    exposition has none (or only NaN)."""
    return vllm_metrics.total(vllm_metrics.read(text, (name,))[name])


def kv_cache_tokens(text: str) -> int | None:
    """KV-cache capacity in tokens: `num_gpu_blocks` x `block_size` in the labels of the first
    `vllm:cache_config_info` sample; None when it is absent or lacks either label."""
    samples = vllm_metrics.read(text, (CACHE_CONFIG_INFO,))[CACHE_CONFIG_INFO]
    if not samples:
        return None
    labels = samples[0].labels()
    try:
        return int(labels["num_gpu_blocks"]) * int(labels["block_size"])
    except (KeyError, ValueError):
        return None
