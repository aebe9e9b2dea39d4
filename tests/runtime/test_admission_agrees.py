"""No spec the launcher refuses passes admission, and admission refuses no extraArgs the launcher
takes: generated runtimes and extraArgs go through `llmfleet validate`'s checks (the Python
twins of the CRD's rules) and through the launcher's plan, for every pool of the spec, on the
runtime config the operator renders for it."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from llmfleet.crds import InferenceService, engine_args
from llmfleet.crds._base import SKIP_RULES
from llmfleet.crds.engine_args import DATA_PARALLEL as DP
from llmfleet.crds.engine_args import PIPELINE_PARALLEL
from llmfleet.crds.engine_args import TENSOR_PARALLEL as TP
from llmfleet.crds.validation import problems
from llmfleet.operator.children import runtime_config
from llmfleet.runtime.args import plan_engine
from llmfleet.runtime.errors import LauncherError
from tests.runtime.helpers import config_of, gpu_of

ARGS = "spec.runtime.extraArgs"
WORDS = [
    # Spellings of the options typed fields set, and of their families.
    "--max-num-seqs", "--max_num_seqs=64", "--max-num-batched-tokens",
    "--max-num-batched-tokens=256",
    "-tp", "--tensor-parallel-size=2", "--tensor_parallel_size", "-dp", "2",
    "-pp", "--pipeline-parallel-size=2", "--pipeline_parallel_size", "-pp=4", "3", "4",
    "-O0", "-O3", "-O", "--optimization-level", "--optimization-level=0", "-O=0", "0",
    "--enforce-eager", "--no-enforce-eager", "--enforce-eager=1",
    "--enable-prefix-caching", "--disable-prefix-caching", "--no-enable-prefix-caching",
    "--no-disable-prefix-caching", "--enable-chunked-prefill", "--disable_chunked_prefill",
    "--kv-cache-dtype", "auto", "fp8", "-q", "awq", "--quantization=fp8",
    "--gpu-memory-utilization", "0.9", "0.90", "0.85", "--device-memory-utilization=0.9",
    "--max-model-len", "2048", "8192", "08192", "--revision=main", "main",
    "--speculative-config", '{"method":"ngram"}', "-sc", "--kv-transfer-config", "{}",
    # The launcher's own, and the refused.
    "--port", "--host=0.0.0.0", "--served-model-name", "--model", "--shutdown-timeout",
    "--disable-log-stats", "--disable_log_stats", "--api-key", "--ssl-keyfile=k", "--headless",
    "--uds", "--kv-cache-memory-bytes", "--load-format", "--load_format=runai_streamer",
    "runai_streamer", "safetensors", "-tp=0", "--max-num-seqs=0", "1.5",
    # Others, values, and pasted lines.
    "--enable-lora", "--max-loras", "4", "--max_loras", "-1", "--seed", "64", "256",
    "vllm serve org/model", "--max-num-seqs 64", "-", "--",
]  # fmt: skip

runtimes = st.fixed_dictionaries(
    {},
    optional={
        "gpu": st.fixed_dictionaries(
            {"type": st.sampled_from(["H100", "A100", "L4"]), "count": st.sampled_from([1, 2, 4])}
        ),
        "tensorParallel": st.sampled_from([1, 2]),
        "quantization": st.sampled_from(["awq", "fp8"]),
        "kvCacheDtype": st.sampled_from(["auto", "fp8"]),
        "prefixCaching": st.booleans(),
        "chunkedPrefill": st.fixed_dictionaries(
            {"enabled": st.booleans()}, optional={"maxBatchedTokens": st.sampled_from([256, 8192])}
        ),
        "cudaGraphs": st.booleans(),
        "maxNumSeqs": st.sampled_from([64, 256]),
        "gpuMemoryUtilization": st.sampled_from([0.9, 0.85]),
        "speculative": st.sampled_from([{"method": "ngram"}, {"method": "eagle", "model": "o/e"}]),
        "extraArgs": st.lists(
            st.one_of(st.sampled_from(WORDS), st.text("-_=a-z0-9. ", max_size=6)), max_size=6
        ),
    },
)
models = st.fixed_dictionaries(
    {"name": st.just("org/model")},
    optional={
        "maxModelLen": st.sampled_from([2048, 8192]),
        "revision": st.just("main"),
        "source": st.sampled_from(["hf://org/model", "s3://bucket/model"]),
    },
)


def manifest(model: dict[str, Any], runtime: dict[str, Any], disaggregated: bool) -> Any:
    topology: dict[str, Any] = {"mode": "Unified"}
    if disaggregated:
        topology = {"mode": "Disaggregated", "prefill": {}, "decode": {},
                    "kvTransfer": {"connector": "NixlConnector"}}  # fmt: skip
    return {
        "apiVersion": "llmfleet.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "prop", "namespace": "team"},
        "spec": {"model": model, "runtime": runtime, "topology": topology},
    }


def launcher_refusal(document: Any) -> str | None:
    """Why the launcher of some pool of the spec refuses it (None: every pool starts). The spec
    is read without its rules, as an older CRD might have admitted it."""
    service = InferenceService.model_validate(document, context={SKIP_RULES: True})
    gpu = service.spec.runtime.gpu
    for pool in service.spec.pools():
        config = config_of(runtime_config(service, pool))
        try:
            plan = plan_engine(config, gpu_of(f"{gpu.type.value}:{gpu.count}"), pod_ip="10.0.0.7")
        except LauncherError as error:
            return str(error)
        assert_engines_fit(plan.argv, gpu.count, list(config.runtime.extra_args))
    return None


def assert_engines_fit(argv: list[str], count: int, words: list[str]) -> None:
    """A command line the launcher plans starts on the pod's GPUs, and leaves none idle unless
    extraArgs set -dp: tensor x pipeline x data parallel fit them (pipeline 1 without -pp, data
    1 without -dp), tensor x pipeline divides them."""
    sizes = {arg.flag: arg.values for arg in engine_args.split(argv[3:])}
    tp, pp, dp = (int(sizes.get(flag, ("1",))[0]) for flag in (TP, PIPELINE_PARALLEL, DP))
    assert tp * pp * dp <= count, (argv, count)
    assert count % (tp * pp) == 0, (argv, count)
    assert engine_args.first_values(words, DP) or tp * pp * dp == count, (argv, count)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(models, runtimes, st.booleans())
@example({"name": "org/model"}, {"extraArgs": ["--port", "1"]}, False)
@example({"name": "org/model"}, {"maxNumSeqs": 64, "extraArgs": ["--max_num_seqs=064"]}, False)
@example({"name": "org/model"}, {"cudaGraphs": False, "extraArgs": ["-O=0"]}, True)
@example({"name": "org/model"}, {"gpu": {"type": "H100", "count": 4}, "extraArgs": ["-pp", "2"]},
         False)  # fmt: skip
@example({"name": "org/model"}, {"gpu": {"type": "H100", "count": 4}, "tensorParallel": 1,
                                 "extraArgs": ["-pp", "2"]}, False)  # fmt: skip
@example({"name": "org/model"}, {"gpu": {"type": "H100", "count": 4},
                                 "extraArgs": ["-tp", "2", "-pp", "2", "-dp", "2"]},
         False)  # fmt: skip
@example({"name": "org/model"}, {"gpu": {"type": "H100", "count": 2},
                                 "extraArgs": ["-tp", "2", "-dp", "2"]}, False)  # fmt: skip
@example({"name": "org/model"}, {"extraArgs": ["-dp", ""]}, False)  # found by this test in CI
@example({"name": "org/model"}, {"extraArgs": ["-tp", "a"]}, False)
@example({"name": "org/model"}, {"gpu": {"type": "H100", "count": 4},
                                 "extraArgs": ["-tp", "2", "-dp", "2"]}, False)  # fmt: skip
def test_admission_accepts_exactly_what_the_launcher_plans(
    model: dict[str, Any], runtime: dict[str, Any], disaggregated: bool
) -> None:
    document = manifest(model, runtime, disaggregated)
    found = problems(document)
    refused = launcher_refusal(document)
    on_args = [problem for problem in found if problem.path == ARGS]
    if not found:
        assert refused is None, f"admitted, but the launcher says: {refused}"
    if refused is None:
        assert on_args == [], on_args
    elif len(found) == len(on_args):
        assert on_args, f"the launcher refuses ({refused}) and admission does not"
