"""The CEL rules of extraArgs read words as the launcher does: each family's regex (what the
rules match words with) holds exactly the words `engine_args.split` reads as one of its flags,
and the rules refuse exactly when the launcher's checks find a problem (the property test in
tests/runtime runs them through admission and the launcher's plan)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmfleet.crds import engine_args, engine_args_cel
from llmfleet.crds.engine_args import FAMILIES, LAUNCHER_OWNED, REFUSED, split, word_regex

PARTS = ["-", "--", "no-", "no_", "enable-", "disable_", "tensor", "-parallel", "_size", "tp",
         "dp", "q", "sc", "O", "O0", "O3", "optimization", "-level", "enforce", "_eager",
         "prefix", "-caching", "chunked_", "prefill", "host", "port", "served-model-name",
         "model", "shutdown-timeout", "disable-log-stats", "gpu-memory-utilization",
         "device-memory-utilization", "=", "=1", "x"]  # fmt: skip
words = (
    st.lists(st.sampled_from(PARTS), min_size=1, max_size=5)
    .map("".join)
    .filter(engine_args.is_option)
)
FLAG_SETS = [*FAMILIES.values(), tuple(LAUNCHER_OWNED), tuple(REFUSED)]


# deadline=None: one example is a split and a regex match, but a busy machine once took over the
# 200 ms default on the first one of a family (the regex compiled then); the test has no timing.
@pytest.mark.parametrize("flags", FLAG_SETS, ids=[",".join(flags) for flags in FLAG_SETS])
@settings(deadline=None)
@given(word=words)
def test_a_familys_regex_holds_the_words_the_launcher_reads_as_it(
    flags: tuple[str, ...], word: str
) -> None:
    [arg] = split([word])
    assert (re.fullmatch(word_regex(flags), word) is not None) == (arg.flag in flags), arg


@pytest.mark.parametrize(
    ("words", "flags"),
    [
        pytest.param(["--tensor_parallel_size=2"], ["--tensor-parallel-size"], id="underscores"),
        pytest.param(["-tp", "2"], ["--tensor-parallel-size"], id="alias"),
        pytest.param(["--no_enable_prefix_caching"], ["--disable-prefix-caching"], id="negation"),
        pytest.param(["-O3"], ["--optimization-level"], id="dash-O-level"),
        pytest.param(["--device_memory_utilization"], ["--gpu-memory-utilization"], id="alias-2"),
    ],
)
def test_spellings_read_as_their_flag(words: list[str], flags: list[str]) -> None:
    assert [arg.flag for arg in split(words)] == flags
    assert re.fullmatch(word_regex(flags), words[0])


def test_every_problem_of_the_launcher_has_a_rule() -> None:
    """Each problem `engine_args.problems` can report is one some admission rule stands for."""
    fields = engine_args.TypedFields(
        max_model_len=2048, revision="main", tensor_parallel=1, quantization="awq",
        kv_cache_dtype="auto", prefix_caching=True, chunked_prefill=False, max_batched_tokens=512,
        max_num_seqs=64, gpu_memory_utilization=0.9, cuda_graphs=True, speculative=True,
        kv_transfer=True, gpu_count=4, streamed_source=True,
    )  # fmt: skip
    samples = [["x"], ["--a b"], ["--disable-log-stats"], ["--port", "1"], ["-q", "awq", "-q"],
               ["--max-model-len", "1"], ["--revision", "x"], ["-tp", "2"], ["-q", "fp8"],
               ["--kv-cache-dtype", "fp8"], ["--max-num-batched-tokens", "1"],
               ["--max-num-seqs", "1"], ["--gpu-memory-utilization", "0.5"], ["-sc", "{}"],
               ["--kv-transfer-config", "{}"], ["--disable-prefix-caching"],
               ["--enable-chunked-prefill"], ["--enforce-eager"], ["-O0"],
               ["--api-key", "k"], ["--ssl-keyfile", "k"], ["--ssl-certfile=c"], ["--headless"],
               ["--uds", "/s"], ["-dp"], ["-dp", "1", "2"], ["--gpu-memory-utilization=2"],
               ["-tp", "3"], ["--kv-cache-memory-bytes", "1"], ["--load-format", "auto"],
               ["--max-num-seqs", "1024"], ["-tp", "16"]]  # fmt: skip
    rules = engine_args_cel.rules()
    for sample in samples:
        found = engine_args.problems(sample, fields)
        assert found, sample
        for problem in found:
            assert any(rule.refuses(problem) for rule in rules), problem


def test_a_spec_is_checked_against_the_launcher_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every extraArgs rule (one per `engine_args_cel.rules()`) reads the launcher's problems of
    the same words: validating a spec asks the launcher once, not once per rule (the gateway
    validates 1,000 specs when it starts, on a thread that shares the GIL with its event loop:
    bench/spec_validation.py), and a spec whose words or typed fields differ is asked anew."""
    from llmfleet.crds import inference_service  # noqa: PLC0415
    from llmfleet.crds.inference_service import InferenceService  # noqa: PLC0415

    inference_service._extra_args_problems.cache_clear()  # what other tests left there
    calls: list[list[str]] = []
    problems = engine_args.problems

    def counted(words: list[str], fields: engine_args.TypedFields) -> list[str]:
        calls.append(words)
        return problems(words, fields)

    monkeypatch.setattr(engine_args, "problems", counted)
    assert len(engine_args_cel.rules()) > 10
    spec = {"model": {"name": "org/once"}, "runtime": {"extraArgs": ["--seed", "7"]}}
    InferenceService.model_validate({"metadata": {}, "spec": spec})
    assert calls == [["--seed", "7"]]
    InferenceService.model_validate({"metadata": {}, "spec": {**spec, "model": {"name": "x/y"}}})
    assert len(calls) == 1  # the same words and typed fields: the same problems
    refused = {**spec, "runtime": {"maxNumSeqs": 9, "extraArgs": ["--max-num-batched-tokens", "4"]}}
    with pytest.raises(ValueError, match="max-num-batched-tokens"):
        InferenceService.model_validate({"metadata": {}, "spec": refused})
    assert calls[1:] == [["--max-num-batched-tokens", "4"]]
