"""One vLLM engine as a discrete-event model: continuous batching, chunked prefill, KV capacity
with recompute preemption, and a prefix cache of block hashes.

An iteration ("step") starts when the previous one ends. Its work follows vLLM V1's scheduler:
every running sequence that is decoding takes one token of the `max_batched_tokens` budget;
partly prefilled sequences take the next chunk of their prompt; then waiting requests are
admitted in arrival order while the budget, `max_num_seqs` and the KV cache allow. Its duration is
`EngineModel`'s step-time formula.

Speed: while every running sequence is decoding and nothing waits that could be admitted, the
batch does not change until a sequence finishes, the KV cache fills, or a request arrives. The
engine then takes k identical steps at once (k = the fewest tokens any sequence still owes, the
free KV tokens / batch, and the steps that start before the next outside event), so a replay
costs per arrival and completion, not per token.

KV cache (in tokens): a running sequence holds its computed tokens. When a decode step needs
more than is free, the most recently admitted sequence is preempted (vLLM's recompute mode): its
KV is freed and it waits at the head of the queue to prefill its prompt and what it generated.

Prefix cache: an LRU of block hashes holding at most the KV capacity. A newly admitted request
reuses the longest run of leading blocks found there (at least one token is always computed),
and its blocks enter the cache when its prefill finishes. NOTE: cached blocks that a running
sequence shares are counted in each sequence's KV (conservative for memory), and the cache does
not shrink while running sequences use the KV (optimistic for hits under pressure).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from llmfleet.autoscaler.sim.model import EngineModel
from llmfleet.autoscaler.sim.traces import Request

_INF = math.inf


class Seq:
    """One request inside the fleet (its timings are the simulation's result)."""

    __slots__ = (
        "cached",
        "computed",
        "finish",
        "first_token",
        "generated",
        "last_token",
        "need",
        "preemptions",
        "request",
        "scheduled",
    )

    def __init__(self, request: Request) -> None:
        self.request = request
        self.need = request.prompt_tokens
        """Tokens that must be in the KV cache before it decodes (prompt, plus what it generated
        before a preemption)."""
        self.computed = 0
        self.cached = -1
        """Prompt tokens served from the prefix cache at the last admission; -1 before it."""
        self.generated = 0
        self.first_token = _INF
        self.last_token = _INF
        self.finish = _INF
        self.preemptions = 0
        self.scheduled = _INF
        """When it was first admitted to the running batch (vLLM's `scheduled_ts`)."""

    @property
    def tokens(self) -> int:
        """Prompt + output tokens: what the gateway counts in flight."""
        return self.request.prompt_tokens + self.request.output_tokens


@dataclass
class Recorder:
    """What all engines of one run measured, in time order per engine: the raw material for
    the autoscaler's windowed signals and the final report."""

    itl_time: list[float] = field(default_factory=list)
    itl_value: list[float] = field(default_factory=list)
    itl_weight: list[int] = field(default_factory=list)
    """ITL samples: step duration, and how many tokens had that gap (batch x steps)."""
    first_time: list[float] = field(default_factory=list)
    first_ttft: list[float] = field(default_factory=list)
    done_time: list[float] = field(default_factory=list)
    done_prompt: list[int] = field(default_factory=list)
    done_output: list[int] = field(default_factory=list)
    done_tpot: list[float] = field(default_factory=list)
    """Per finished request: its mean gap between tokens (vLLM's per-request TPOT)."""
    done_prefill: list[float] = field(default_factory=list)
    """Per finished request: first admission to first token (vLLM's prefill time, observed at
    the finish as vLLM does)."""
    prefill_time: list[float] = field(default_factory=list)
    prefill_tokens: list[int] = field(default_factory=list)
    arrival_time: list[float] = field(default_factory=list)
    arrival_prompt: list[int] = field(default_factory=list)
    arrival_output: list[int] = field(default_factory=list)
    """Requests as the gateway saw them enter (the frontend's view, e.g. Dynamo's planner)."""
    preemptions: int = 0
    prefix_hit_tokens: int = 0
    prompt_tokens: int = 0


class Engine:
    """The engine of one pod."""

    def __init__(self, model: EngineModel, recorder: Recorder, *, prefix_cache: bool) -> None:
        self.model = model
        self.recorder = recorder
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.clock = 0.0
        """When the next step may start (the end of the current one while busy)."""
        self.kv_used = 0
        self.in_flight_tokens = 0
        self.cache: OrderedDict[int, None] | None = OrderedDict() if prefix_cache else None
        self._cache_blocks = model.kv_tokens // model.block_tokens
        self.rejected: list[Seq] = []

    @property
    def busy(self) -> bool:
        return bool(self.running or self.waiting)

    @property
    def in_flight(self) -> int:
        return len(self.running) + len(self.waiting)

    @property
    def kv_usage(self) -> float:
        return self.kv_used / self.model.kv_tokens

    def add(self, seq: Seq, now: float) -> None:
        """A request arrives at `now` (the engine must have been advanced to `now`)."""
        if seq.tokens > self.model.kv_tokens:
            # vLLM rejects a request that can never fit (max_model_len); it counts as missed.
            self.rejected.append(seq)
            return
        if not self.busy:
            self.clock = max(self.clock, now)
        self.waiting.append(seq)
        self.in_flight_tokens += seq.tokens

    def advance(self, until: float) -> None:
        """Run every step that starts before `until`."""
        while self.clock < until and (self.running or self.waiting):
            if not self._step(until):
                break

    def prefix_hit(self, blocks: tuple[int, ...]) -> int:
        """Leading blocks of `blocks` present in the cache (touching them as used)."""
        cache = self.cache
        if cache is None:
            return 0
        hits = 0
        for block in blocks:
            if block not in cache:
                break
            cache.move_to_end(block)
            hits += 1
        return hits

    def _remember(self, blocks: tuple[int, ...]) -> None:
        cache = self.cache
        if cache is None:
            return
        for block in blocks:
            cache[block] = None
            cache.move_to_end(block)
        while len(cache) > self._cache_blocks:
            cache.popitem(last=False)

    def _preempt(self) -> Seq:
        victim = self.running.pop()
        self.kv_used -= victim.computed
        victim.computed = 0
        victim.cached = -1
        victim.need = victim.request.prompt_tokens + victim.generated
        victim.preemptions += 1
        self.recorder.preemptions += 1
        self.waiting.appendleft(victim)
        return victim

    def _step(self, until: float) -> bool:
        """One step (or k identical decode steps); False when nothing can run."""
        model = self.model
        running = self.running
        # Decodes first need one KV token each; preempt the newest until they fit.
        while running:
            decoding = sum(1 for q in running if q.computed >= q.need)
            if decoding <= model.kv_tokens - self.kv_used:
                break
            self._preempt()
        prefilling = [q for q in running if q.computed < q.need]
        decoding_seqs = [q for q in running if q.computed >= q.need]
        if not prefilling and not self._admissible():
            if not decoding_seqs:
                return False
            self._decode_run(decoding_seqs, until)
            return True
        self._mixed(decoding_seqs, prefilling)
        return True

    def _admissible(self) -> bool:
        """Whether the head of the queue could start prefilling now."""
        if not self.waiting or len(self.running) >= self.model.max_num_seqs:
            return False
        head = self.waiting[0]
        free = self.model.kv_tokens - self.kv_used
        need = min(head.need, self.model.max_batched_tokens)
        return free >= need or not self.running

    def _decode_run(self, seqs: list[Seq], until: float) -> None:
        model = self.model
        batch = len(seqs)
        context = sum(q.computed for q in seqs)
        dt = model.decode_step_s(batch, context)
        owed = min(q.request.output_tokens - q.generated for q in seqs)
        free = (model.kv_tokens - self.kv_used) // batch
        horizon = max(1, math.ceil((until - self.clock) / dt)) if until < _INF else owed
        k = max(1, min(owed, free, horizon))
        end = self.clock + k * dt
        self.clock = end
        self.kv_used += batch * k
        rec = self.recorder
        rec.itl_time.append(end)
        rec.itl_value.append(dt)
        rec.itl_weight.append(batch * k)
        finished = False
        for q in seqs:
            q.computed += k
            q.need += k
            q.generated += k
            q.last_token = end
            if q.generated >= q.request.output_tokens:
                finished = True
        if finished:
            self._finish_done(end)

    def _mixed(self, decoding: list[Seq], prefilling: list[Seq]) -> None:
        model = self.model
        budget = model.max_batched_tokens - len(decoding)
        free = model.kv_tokens - self.kv_used - len(decoding)
        chunks: list[tuple[Seq, int]] = []
        for q in prefilling:
            chunk = min(q.need - q.computed, budget, free)
            if chunk <= 0:
                break
            chunks.append((q, chunk))
            budget -= chunk
            free -= chunk
        self._admit(chunks, budget, free)
        if not chunks and not decoding and len(self.running) > 1:
            # NOTE: partly prefilled sequences filled the KV cache between them and none can go
            # on: free the newest (recompute later), as vLLM does when an allocation fails.
            self._preempt()
            return
        context = sum(q.computed for q in decoding)
        tokens = len(decoding) + sum(chunk for _, chunk in chunks)
        work = sum(chunk * (q.computed + chunk / 2.0) for q, chunk in chunks)
        duration = model.step_s(tokens, context, work)
        end = self.clock + duration
        self.clock = end
        rec = self.recorder
        if decoding:
            rec.itl_time.append(end)
            rec.itl_value.append(duration)
            rec.itl_weight.append(len(decoding))
            self.kv_used += len(decoding)
            for q in decoding:
                q.computed += 1
                q.need += 1
                q.generated += 1
                q.last_token = end
        for q, chunk in chunks:
            q.computed += chunk
            self.kv_used += chunk
            if q.computed >= q.need:
                if q.generated == 0:
                    q.first_token = end
                    rec.first_time.append(end)
                    rec.first_ttft.append(end - q.request.arrival)
                    rec.prefill_time.append(end)
                    rec.prefill_tokens.append(q.request.prompt_tokens)
                    rec.prompt_tokens += q.request.prompt_tokens
                    self._remember(q.request.blocks)
                q.generated += 1
                q.last_token = end
        self._finish_done(end)

    def _admit(self, chunks: list[tuple[Seq, int]], budget: int, free: int) -> None:
        """Admit waiting requests in order while budget, sequences and KV allow (vLLM V1)."""
        model = self.model
        while self.waiting and budget > 0 and len(self.running) < model.max_num_seqs:
            q = self.waiting[0]
            cached = 0
            if q.request.blocks and self.cache is not None:
                hits = self.prefix_hit(q.request.blocks)
                cached = min(hits * model.block_tokens, q.need - 1)
            chunk = min(q.need - cached, budget)
            if cached + chunk > free and (self.running or chunks):
                break
            if cached + chunk > free:
                chunk = max(free - cached, 0)  # alone on the engine: take what there is
                if chunk <= 0:
                    break
            self.waiting.popleft()
            self.running.append(q)
            q.scheduled = min(q.scheduled, self.clock)
            q.cached = cached
            q.computed = cached
            self.kv_used += cached
            free -= cached + chunk
            budget -= chunk
            self.recorder.prefix_hit_tokens += cached
            chunks.append((q, chunk))

    def _finish_done(self, now: float) -> None:
        keep: list[Seq] = []
        rec = self.recorder
        for q in self.running:
            if q.generated >= q.request.output_tokens and q.computed >= q.need:
                q.finish = now
                self.kv_used -= q.computed
                self.in_flight_tokens -= q.tokens
                rec.done_time.append(now)
                rec.done_prompt.append(q.request.prompt_tokens)
                rec.done_output.append(q.request.output_tokens)
                rec.done_tpot.append((now - q.first_token) / max(q.request.output_tokens - 1, 1))
                rec.done_prefill.append(q.first_token - q.scheduled)
            else:
                keep.append(q)
        self.running = keep
