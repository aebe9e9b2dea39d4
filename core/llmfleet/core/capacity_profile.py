"""The capacity profile: what `llmfleet-runtime profile` measures and the autoscaler reads.

It lives in core because both sides need the type and neither may import the other.

One JSON document per engine configuration (model x GPU x runtime settings), camelCase keys,
`schemaVersion` bumped on any incompatible change. Latencies are milliseconds, rates per second.
The autoscaler sizes prefill pools with `prefillTokensPerSecond`/`ttftFit`, decode pools with
`itl` (ITL against concurrency) and `maxConcurrency`; the launcher can take
`prefillTokensPerSecond` and `decodeStepMs` as its `calibration`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

SCHEMA_VERSION = 1


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, use_attribute_docstrings=True, frozen=True
    )


class TtftPoint(_Model):
    prompt_tokens: int
    """Prompt length the engine reported (`usage.prompt_tokens`), median over the samples."""
    requested_tokens: int
    """Prompt length the profiler aimed for."""
    p50_ms: float
    p95_ms: float
    samples: int


class ItlPoint(_Model):
    concurrency: int
    """Streams decoding at the same time."""
    p50_ms: float
    """Median gap between consecutive streamed tokens, over all streams."""
    p95_ms: float
    ttft_p50_ms: float
    """Median time to first token at this concurrency (queueing shows here first)."""
    output_tokens_per_second: float
    """Generated tokens per second, all streams together."""
    samples: int


class TtftFit(_Model):
    """Least-squares line through the TTFT points: ttft = interceptMs + msPerPromptToken x n."""

    intercept_ms: float
    ms_per_prompt_token: float


class MaxConcurrency(_Model):
    value: int
    """Most concurrent requests the engine ran without queueing or preempting."""
    limited_by: Literal["queueing", "preemption", "search-limit"]
    """What the next step up ran into (`search-limit`: nothing, up to `--max-concurrency`)."""
    tested_up_to: int


class CapacityProfile(_Model):
    schema_version: int = SCHEMA_VERSION
    url: str
    model: str
    measured_at: str
    """UTC, ISO 8601."""
    output_tokens: int
    """Tokens each profiling request generated."""
    ttft: list[TtftPoint]
    """TTFT against prompt length, one request at a time."""
    ttft_fit: TtftFit | None
    """None with fewer than two prompt lengths."""
    prefill_tokens_per_second: float | None
    """1000 / msPerPromptToken; None when TTFT does not measurably grow with the prompt."""
    itl: list[ItlPoint]
    """ITL against concurrency."""
    decode_step_ms: float
    """ITL p50 at the lowest concurrency measured."""
    max_concurrency: MaxConcurrency
    kv_cache_tokens: int | None = None
    """KV-cache capacity in tokens (`vllm:cache_config_info` num_gpu_blocks x block_size);
    None when the engine does not export it."""
