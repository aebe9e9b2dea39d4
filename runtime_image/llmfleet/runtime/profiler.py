"""`llmfleet-runtime profile`: measure an OpenAI-compatible engine's capacity profile.

Three measurements, each from streamed `/v1/completions` with `ignore_eos` (so every request
generates exactly `output_tokens`):
1. TTFT against prompt length: one request at a time, each prompt starting with a fresh nonce so
   no prefix cache can shorten it.
2. ITL against concurrency: `c` streams at once; gaps between consecutive tokens over all streams.
3. Maximum concurrency: double `c` until the engine queues (`vllm:num_requests_waiting` > 0) or
   preempts (`vllm:num_preemptions_total` grows) during a burst, then bisect between the last
   clean level and the first that was not.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from llmfleet.core import loopback
from llmfleet.core.capacity_profile import (
    CapacityProfile,
    ItlPoint,
    MaxConcurrency,
    TtftFit,
    TtftPoint,
)
from llmfleet.core.loopback import LoopbackGuard, guarded
from llmfleet.runtime import metrics
from llmfleet.runtime.errors import ExitCode, LauncherError

PREEMPTIONS = "vllm:num_preemptions_total"
METRICS_POLL_SECONDS = 0.05
# Timer and scheduling noise in one TTFT sample is about a millisecond here; growth below this
# is not a prefill cost.
MIN_TTFT_GROWTH_MS = 2.0
# A saturation burst's requests decode for about this long (10 polls), capped in tokens.
SATURATION_BURST_SECONDS = 0.5
SATURATION_MAX_TOKENS = 1024


@dataclass(frozen=True)
class ProfileSettings:
    url: str
    model: str | None = None
    prompt_lengths: list[int] = field(default_factory=lambda: [128, 512, 2048])
    concurrencies: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    output_tokens: int = 32
    repeats: int = 3
    max_concurrency: int = 256
    timeout_seconds: float = 300.0


@dataclass(frozen=True)
class Sample:
    ttft_ms: float
    gaps_ms: list[float]
    prompt_tokens: int | None
    tokens: int


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


def fit_line(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """Least squares (intercept, slope) through (x, y) points; None for fewer than two x values."""
    xs = [x for x, _ in points]
    if len(set(xs)) < 2:
        return None
    slope, intercept = statistics.linear_regression(xs, [y for _, y in points])
    return intercept, slope


def prefill_rate(points: list[TtftPoint], fit: TtftFit | None) -> float | None:
    """Prompt tokens per second from the TTFT slope, or None when TTFT does not grow
    measurably over the lengths measured (less than 2 ms or 10% of the shortest TTFT): then the
    slope is noise, and its inverse an absurd rate."""
    if fit is None or fit.ms_per_prompt_token <= 0:
        return None
    span = max(p.prompt_tokens for p in points) - min(p.prompt_tokens for p in points)
    growth = fit.ms_per_prompt_token * span
    if growth < max(MIN_TTFT_GROWTH_MS, 0.1 * min(p.p50_ms for p in points)):
        return None
    return 1000 / fit.ms_per_prompt_token


def _prompt(tokens: int) -> str:
    # A fresh nonce first, so no two prompts share a cached prefix; then one short word per token
    # (common English words are one token in every mainstream tokenizer).
    return uuid.uuid4().hex[:8] + " " + " ".join(["hello"] * max(1, tokens - 1))


class _Profiler:
    def __init__(self, settings: ProfileSettings, client: httpx.AsyncClient, model: str) -> None:
        self.settings = settings
        self.client = client
        self.model = model

    async def one(self, prompt_tokens: int, output_tokens: int | None = None) -> Sample:
        body = {
            "model": self.model,
            "prompt": _prompt(prompt_tokens),
            "max_tokens": output_tokens or self.settings.output_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        started = time.perf_counter()
        stamps: list[float] = []
        usage_prompt: int | None = None
        async with self.client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                text = (await response.aread())[:160].decode(errors="replace")
                raise LauncherError(
                    ExitCode.PROFILE_FAILED,
                    f"profile request got HTTP {response.status_code}: {text}",
                )
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = httpx.Response(200, content=line[6:]).json()
                if chunk.get("usage"):
                    usage_prompt = chunk["usage"].get("prompt_tokens")
                if any(choice.get("text") for choice in chunk.get("choices", [])):
                    stamps.append(time.perf_counter())
        if not stamps:
            raise LauncherError(ExitCode.PROFILE_FAILED, "profile request streamed no tokens")
        gaps = [1000 * (b - a) for a, b in itertools.pairwise(stamps)]
        return Sample(1000 * (stamps[0] - started), gaps, usage_prompt, len(stamps))

    async def burst(
        self, concurrency: int, prompt_tokens: int, output_tokens: int | None = None
    ) -> list[Sample]:
        requests = (self.one(prompt_tokens, output_tokens) for _ in range(concurrency))
        return list(await asyncio.gather(*requests))

    async def watched_burst(
        self, concurrency: int, output_tokens: int
    ) -> tuple[list[Sample], str | None]:
        """A burst while polling the engine's gauges; returns what limited it, if anything."""
        before = await self.scrape()
        preempted_before = metrics.gauge_sum(before, PREEMPTIONS) or 0.0
        waiting_seen, waiting_before = False, False
        task = asyncio.create_task(self.burst(concurrency, 16, output_tokens))
        while not task.done():
            text = await self.scrape()
            # Queueing is waiting in two polls running: a scheduler that admits a burst at its
            # next step shows a waiting request for one step (milliseconds), not for 50 ms.
            waiting = (metrics.gauge_sum(text, metrics.WAITING) or 0) > 0
            waiting_seen |= waiting and waiting_before
            waiting_before = waiting
            await asyncio.sleep(METRICS_POLL_SECONDS)
        samples = task.result()
        preempted = (metrics.gauge_sum(await self.scrape(), PREEMPTIONS) or 0.0) > preempted_before
        return samples, "preemption" if preempted else "queueing" if waiting_seen else None

    async def scrape(self) -> str:
        with contextlib.suppress(httpx.HTTPError):
            response = await self.client.get("/metrics")
            if response.status_code == 200:
                return response.text
        return ""


async def _model_card(client: httpx.AsyncClient, wanted: str | None) -> tuple[str, int | None]:
    """The model to profile (`wanted`, else the first served) and its context length, which
    vLLM (and the simulator) put in /v1/models as `max_model_len`."""
    response = await client.get("/v1/models")
    cards = response.json().get("data") if response.status_code == 200 else None
    if not cards:
        raise LauncherError(ExitCode.PROFILE_FAILED, "GET /v1/models lists no model")
    card = next((c for c in cards if c.get("id") == wanted), cards[0])
    model: str = wanted or card["id"]
    length = card.get("max_model_len")
    return model, length if isinstance(length, int) else None


async def _max_concurrency(
    profiler: _Profiler, limit: int, output_tokens: int, step: Callable[[str], None]
) -> MaxConcurrency:
    good, bad, reason = 0, None, "search-limit"
    level = 1
    while level <= limit:
        step(f"max concurrency: trying {level}")
        _, limited = await profiler.watched_burst(level, output_tokens)
        if limited is not None:
            bad, reason = level, limited
            break
        good, level = level, level * 2
    if bad is not None:
        while bad - good > 1:
            middle = (good + bad) // 2
            step(f"max concurrency: trying {middle}")
            _, limited = await profiler.watched_burst(middle, output_tokens)
            if limited is None:
                good = middle
            else:
                bad, reason = middle, limited
    tested = bad if bad is not None else good
    return MaxConcurrency(value=good, limited_by=reason, tested_up_to=tested)  # type: ignore[arg-type]


async def profile(settings: ProfileSettings, step: Callable[[str], None]) -> CapacityProfile:
    try:
        return await _profile(settings, step)
    except httpx.HTTPError as error:
        raise LauncherError(
            ExitCode.PROFILE_FAILED,
            f"profiling {settings.url} failed: {type(error).__name__} {error}".strip(),
        ) from None


async def _profile(settings: ProfileSettings, step: Callable[[str], None]) -> CapacityProfile:
    limits = httpx.Limits(max_connections=settings.max_concurrency + 8)
    timeout = httpx.Timeout(settings.timeout_seconds, connect=10)
    # With LLMFLEET_LOOPBACK_ONLY on, a URL outside loopback fails here before connecting.
    transport = guarded(None, LoopbackGuard(loopback.enabled()), "profile", limits)
    async with httpx.AsyncClient(
        base_url=settings.url, timeout=timeout, limits=limits, transport=transport
    ) as client:
        model, context = await _model_card(client, settings.model)
        profiler = _Profiler(settings, client, model)
        await profiler.one(16)  # a first request pays one-off costs; keep it out of the figures
        ttft: list[TtftPoint] = []
        for length in settings.prompt_lengths:
            step(f"TTFT at {length} prompt tokens")
            samples = [await profiler.one(length) for _ in range(settings.repeats)]
            ttfts = [s.ttft_ms for s in samples]
            reported = [s.prompt_tokens for s in samples if s.prompt_tokens is not None]
            ttft.append(
                TtftPoint(
                    prompt_tokens=int(statistics.median(reported)) if reported else length,
                    requested_tokens=length,
                    p50_ms=statistics.median(ttfts),
                    p95_ms=percentile(ttfts, 95),
                    samples=len(samples),
                )
            )
        itl: list[ItlPoint] = []
        for concurrency in settings.concurrencies:
            step(f"ITL at concurrency {concurrency}")
            started = time.perf_counter()
            samples = []
            for _ in range(settings.repeats):
                samples += await profiler.burst(concurrency, 16)
            elapsed = time.perf_counter() - started
            gaps = [gap for s in samples for gap in s.gaps_ms]
            if not gaps:
                raise LauncherError(ExitCode.PROFILE_FAILED, "streams had a single token each")
            itl.append(
                ItlPoint(
                    concurrency=concurrency,
                    p50_ms=statistics.median(gaps),
                    p95_ms=percentile(gaps, 95),
                    ttft_p50_ms=statistics.median(s.ttft_ms for s in samples),
                    output_tokens_per_second=sum(s.tokens for s in samples) / elapsed,
                    samples=len(samples),
                )
            )
        # Each burst must outlast several metric polls, or a queue can form and drain unseen.
        wanted = math.ceil(1000 * SATURATION_BURST_SECONDS / max(itl[0].p50_ms, 0.1))
        # (the 16-token prompt plus the output must fit the model's context)
        cap = min(SATURATION_MAX_TOKENS, (context or SATURATION_MAX_TOKENS + 64) - 64)
        burst_tokens = max(settings.output_tokens, min(wanted, cap))
        ceiling = await _max_concurrency(profiler, settings.max_concurrency, burst_tokens, step)
        kv_tokens = metrics.kv_cache_tokens(await profiler.scrape())
    line = fit_line([(p.prompt_tokens, p.p50_ms) for p in ttft])
    fit = TtftFit(intercept_ms=line[0], ms_per_prompt_token=line[1]) if line else None
    rate = prefill_rate(ttft, fit)
    return CapacityProfile(
        url=settings.url,
        model=model,
        measured_at=datetime.now(UTC).isoformat(timespec="seconds"),
        output_tokens=settings.output_tokens,
        ttft=ttft,
        ttft_fit=fit,
        prefill_tokens_per_second=rate,
        itl=itl,
        decode_step_ms=itl[0].p50_ms,
        max_concurrency=ceiling,
        kv_cache_tokens=kv_tokens,
    )


def run_profile(settings: ProfileSettings, console: Console | None = None) -> CapacityProfile:
    """Run the profile with a progress bar on `console` (stderr by default)."""
    total = len(settings.prompt_lengths) + len(settings.concurrencies) + 1
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console or Console(stderr=True),
    ) as progress:
        task = progress.add_task("profiling", total=total)
        seen: set[str] = set()

        def step(description: str) -> None:
            # One bar step per measurement; the search's many tries share the last one.
            kind = description.split(":", 1)[0]
            if kind not in seen:
                seen.add(kind)
                progress.advance(task, 1 if len(seen) > 1 else 0)
            progress.update(task, description=description)

        result = asyncio.run(profile(settings, step))
        progress.update(task, completed=total, description="done")
    return result
