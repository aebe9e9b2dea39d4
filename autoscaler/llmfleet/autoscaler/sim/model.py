"""Engine constants: one vLLM engine serving Llama-3.1-8B in BF16 on one H100 SXM (80 GB).

Every constant carries its source, or says it is an estimate and what it rests on. Figures marked
(facts) are from NVIDIA NIM's published tables and llm-d-benchmark's memory measurements.

Step time of one engine iteration (continuous batching, chunked prefill), a roofline: the
weights are read once per step while the batch's tokens are computed, whichever is longer, plus
the per-sequence KV reads of decodes and the attention of prefill chunks:

    step = overhead + max(weights, (n_decode + prefill tokens) x token)
           + ctx_decode x kv_read + sum over chunks c of c x attention x (done + c / 2)

- `token` 1/27,000 s: 27k prompt tokens/s per H100 for an 8B BF16 model, the runtime launcher's
  reference (`runtime_image/llmfleet/runtime/sizing.py`: NIM's Llama-3.3-70B FP8 prefill of
  12.3k tok/s on 2 GPUs is 44 % MFU; 44 % of 989 BF16 TFLOPS at 16 GFLOP a token).
- `weights` 4.0 ms and `overhead` 0.6 ms: NIM's Llama-3.1-8B ITL at concurrency 1 is 4.6 ms
  (facts); the split between reading 15 GiB of weights and scheduling/sampling is an estimate.
- `kv_read` 46 ns per token of context: 131,072 bytes a token (`config.json`: 32 layers x 8 KV
  heads x 128 x K,V x 2 bytes) at 85 % of the 3.35 TB/s HBM3 bandwidth (H100 SXM datasheet;
  85 % achieved is an estimate).
- Check against NIM's table (facts) with ~500 tokens of context per stream (an estimate of its
  test prompts): 5.8 / 6.9 / 12.6 / 15.6 ms at 50 / 100 / 200 / 250 streams against the
  published 5.9 / 7.6 / 12.7 / 16.1 ms.
- `attention` 1.06 ns per token per earlier token: causal attention costs 4 x 32 layers x 4096 =
  524k FLOPs per token per token of context, at 50 % of 989 TFLOPS (FlashAttention-3 reaches
  50-75 % on H100, Shah et al. 2024; the lower end is the estimate).

KV cache 421k tokens: llm-d-benchmark measured 51.38 GiB of KV for Llama-3.1-8B BF16 TP1 at
`--gpu-memory-utilization 0.9` (facts), / 131,072 bytes.

Scheduler limits (`for_slo`) are what llmfleet's launcher sets for the ITL target
(`runtime_image/llmfleet/runtime/sizing.py`): `max_num_batched_tokens` = a chunk that prefills in
half the ITL target (rounded down to 256), `max_num_seqs` = the decode batch that fits the other
half (4.6 ms + 0.046 ms a sequence), 8..1024. Without an ITL target: vLLM's H100 defaults, 8192
and 1024.

Pods: a new pod holds its GPU from creation and serves after `cold_start_s` = 90 s: vLLM pods
take 1.5-5 min cold and about 1 min with image and weights cached (facts; Llama-3.1-8B loads in
31.5 s, CUDA graph capture 10-17 s), so 90 s is a cached node's figure plus scheduling and
readiness (estimate, favourable to the baselines). A warm spare serves after `promote_s` = 2 s:
llmfleet's cluster test promotes a spare in 0.28 s (label flip); the Service's EndpointSlice and
the gateway's 1 s discovery add the rest (estimate).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

_FLOPS = 989e12
"""H100 SXM dense BF16 tensor FLOPS (NVIDIA H100 datasheet; 1,979 with sparsity)."""
_BANDWIDTH = 3.35e12
"""H100 SXM HBM3 bytes per second (NVIDIA H100 datasheet)."""
_CHUNK_SHARE = 0.5
"""Share of the ITL target the launcher gives a prefill chunk (`CHUNK_SHARE_OF_ITL`)."""
KV_BYTES_PER_TOKEN = 32 * 8 * 128 * 2 * 2
"""Llama-3.1-8B `config.json`: 32 layers, 8 KV heads, head dim 128, K and V, 2 bytes (BF16)."""


@dataclass(frozen=True)
class EngineModel:
    """One engine's constants (see the module docstring for each source)."""

    overhead_s: float = 0.0006
    weights_s: float = 0.004
    token_s: float = 1.0 / 27_000
    kv_read_s: float = KV_BYTES_PER_TOKEN / (_BANDWIDTH * 0.85)
    attention_s: float = 4 * 32 * 4096 / (_FLOPS * 0.5)
    kv_tokens: int = int(51.38 * 2**30 / KV_BYTES_PER_TOKEN)
    max_batched_tokens: int = 8192
    max_num_seqs: int = 1024
    block_tokens: int = 512
    """Prefix-cache granularity: the trace's hash blocks (vLLM hashes 16-token blocks; a 512-token
    trace block is 32 of them, all hit or all missed together)."""
    cold_start_s: float = 90.0
    promote_s: float = 2.0
    gpus_per_pod: int = 1

    def for_slo(self, itl_ms: float | None) -> EngineModel:
        """This engine with the scheduler limits llmfleet's launcher sets for the ITL target."""
        base = self
        if itl_ms is None:
            return base
        chunk = int((1.0 / base.token_s) * itl_ms * _CHUNK_SHARE / 1000)
        tokens = max(256, chunk // 256 * 256)
        budget = itl_ms * (1 - _CHUNK_SHARE)
        seqs = 1 + int((budget - 4.6) / 0.046) if budget > 4.6 else 1
        seqs = max(8, min(1024, seqs))
        return replace(
            base, max_batched_tokens=max(tokens, -(-seqs // 256) * 256), max_num_seqs=seqs
        )

    def step_s(self, tokens: int, decode_context: float, attention_work: float) -> float:
        """A step computing `tokens` (decodes + prefill chunks), reading `decode_context` KV
        tokens for its decodes, with `attention_work` = sum of chunk x (done + chunk / 2)."""
        return (
            self.overhead_s
            + max(self.weights_s, tokens * self.token_s)
            + decode_context * self.kv_read_s
            + attention_work * self.attention_s
        )

    def decode_step_s(self, batch: int, context_tokens: float) -> float:
        return self.step_s(batch, context_tokens, 0.0)

    def lone_ttft_s(self, prompt_tokens: int) -> float:
        """TTFT of one request on an idle engine: its chunks back to back."""
        total, done = 0.0, 0
        while done < prompt_tokens:
            chunk = min(self.max_batched_tokens, prompt_tokens - done)
            total += self.step_s(chunk, 0.0, chunk * (done + chunk / 2.0))
            done += chunk
        return total
