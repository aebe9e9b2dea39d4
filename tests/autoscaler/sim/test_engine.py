"""Engine model properties: load costs latency, KV exhaustion preempts, prefix hits save prefill."""

from __future__ import annotations

from dataclasses import replace

from llmfleet.autoscaler.sim.engine import Engine, Recorder, Seq
from llmfleet.autoscaler.sim.model import EngineModel
from llmfleet.autoscaler.sim.traces import Request

MODEL = EngineModel().for_slo(50.0)


def _run(requests: list[Request], model: EngineModel = MODEL, *, cache: bool = True) -> list[Seq]:
    engine = Engine(model, Recorder(), prefix_cache=cache)
    seqs = [Seq(r) for r in requests]
    for seq in seqs:
        engine.advance(seq.request.arrival)
        engine.add(seq, seq.request.arrival)
    engine.advance(float("inf"))
    assert not engine.busy
    return seqs


def test_a_lone_request_takes_its_modelled_ttft_and_decodes_at_the_single_stream_itl() -> None:
    (seq,) = _run([Request(0.0, 2000, 11)])
    assert abs(seq.first_token - MODEL.lone_ttft_s(2000)) < 1e-9
    itl = (seq.finish - seq.first_token) / 10
    assert abs(itl - MODEL.decode_step_s(1, 2005)) < 0.001


def test_more_load_means_more_latency() -> None:
    light = _run([Request(i * 1.0, 2000, 50) for i in range(20)])
    heavy = _run([Request(i * 0.02, 2000, 50) for i in range(200)])

    def mean_ttft(seqs: list[Seq]) -> float:
        return sum(s.first_token - s.request.arrival for s in seqs) / len(seqs)

    def mean_tpot(seqs: list[Seq]) -> float:
        return sum((s.finish - s.first_token) / 49 for s in seqs) / len(seqs)

    assert mean_ttft(heavy) > 3 * mean_ttft(light)
    assert mean_tpot(heavy) > mean_tpot(light)


def test_kv_exhaustion_preempts_and_every_request_still_finishes() -> None:
    small = replace(MODEL, kv_tokens=6000)
    recorder = Recorder()
    engine = Engine(small, recorder, prefix_cache=False)
    seqs = [Seq(Request(0.0, 1000, 1500)) for _ in range(4)]
    for seq in seqs:
        engine.add(seq, 0.0)
    engine.advance(float("inf"))
    assert recorder.preemptions > 0
    assert all(s.finish < float("inf") for s in seqs)
    assert sum(s.preemptions for s in seqs) == recorder.preemptions


def test_roomy_kv_never_preempts() -> None:
    recorder = Recorder()
    engine = Engine(MODEL, recorder, prefix_cache=False)
    for _ in range(4):
        engine.add(Seq(Request(0.0, 1000, 1500)), 0.0)
    engine.advance(float("inf"))
    assert recorder.preemptions == 0


def test_a_prefix_hit_shortens_the_prefill() -> None:
    blocks = tuple(range(32))  # 16k tokens of shared prefix
    first, second = _run([Request(0.0, 16_384, 2, blocks), Request(10.0, 16_384, 2, blocks)])
    cold = first.first_token - first.request.arrival
    warm = second.first_token - second.request.arrival
    assert second.cached == 16_383
    assert warm < cold / 10


def test_without_a_prefix_cache_nothing_is_reused() -> None:
    blocks = tuple(range(8))
    _, second = _run([Request(0.0, 4096, 2, blocks), Request(10.0, 4096, 2, blocks)], cache=False)
    assert second.cached == 0


def test_a_request_larger_than_the_kv_cache_is_rejected() -> None:
    small = replace(MODEL, kv_tokens=1000)
    engine = Engine(small, Recorder(), prefix_cache=False)
    seq = Seq(Request(0.0, 2000, 5))
    engine.add(seq, 0.0)
    engine.advance(float("inf"))
    assert engine.rejected == [seq]
    assert seq.first_token == float("inf")


def test_launcher_sizing_fits_the_chunk_into_half_the_itl_target() -> None:
    assert MODEL.max_batched_tokens == 512
    assert 1000 * MODEL.step_s(MODEL.max_batched_tokens, 0.0, 0.0) <= 25.0
    assert EngineModel().for_slo(None).max_batched_tokens == 8192
