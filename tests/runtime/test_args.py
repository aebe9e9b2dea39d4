"""The argument builder: spec x GPU -> `vllm serve` line, and the inputs it refuses."""

from __future__ import annotations

from typing import Any

import pytest

from llmfleet.runtime.args import plan_engine
from llmfleet.runtime.errors import ExitCode, LauncherError
from llmfleet.runtime.options import split_args
from tests.runtime.cases import CASES, MODEL, Case, cfg
from tests.runtime.helpers import config_of, gpu_of, options_of


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_builder_table(case: Case) -> None:
    plan = plan_engine(config_of(case.config), gpu_of(case.gpu), pod_ip="10.0.0.7")
    options = options_of(plan.argv)
    assert plan.argv[2] == MODEL["name"]
    for flag, value in case.expect.items():
        assert flag in options, f"{flag} missing from {plan.argv}"
        assert options[flag] == value, f"{flag}: {options[flag]!r} != {value!r}"
    for flag in case.absent:
        assert flag not in options, f"{flag} should not be in {plan.argv}"
    for name, value in case.env.items():
        assert plan.env.get(name) == value


def test_every_default_is_explained_in_the_decisions() -> None:
    plan = plan_engine(config_of(cfg(slo={"itlP95Ms": 50})), gpu_of("H100:1"))
    explained = " ".join(plan.decisions)
    for flag in (
        "--kv-cache-dtype fp8",
        "--enable-prefix-caching",
        "--max-num-batched-tokens 512",
        "--max-num-seqs",
        "--gpu-memory-utilization 0.9",
        "--optimization-level 2",
    ):
        assert flag in explained


@pytest.mark.parametrize(
    ("gpu", "slo", "said", "not_said"),
    [
        pytest.param("CPU:1", {}, ["(a CPU figure", "a CPU engine has no CUDA graphs"],
                     ["WARNING", "0.9", "H100"], id="cpu-defaults-say-cpu"),
        pytest.param("CPU:1", {"itlP95Ms": 50}, ["WARNING SLO targets are not sized for on a CPU"],
                     ["tok/s"], id="cpu-slo-warns"),
        pytest.param("H100:1", {}, ["the fraction our KV-capacity figures"], ["CPU"],
                     id="gpu-says-nothing-of-cpus"),
    ],
)  # fmt: skip
def test_cpu_decisions_say_they_are_cpu_figures(
    gpu: str, slo: dict[str, float], said: list[str], not_said: list[str]
) -> None:
    plan = plan_engine(config_of(cfg(slo=slo)), gpu_of(gpu))
    explained = "\n".join(plan.decisions)
    for words in said:
        assert words in explained
    for words in not_said:
        assert words not in explained


def test_replaced_defaults_are_reported() -> None:
    plan = plan_engine(
        config_of(cfg(runtime={"extraArgs": ["--max-num-seqs", "64"]})), gpu_of("H100:1")
    )
    assert any("extraArgs --max-num-seqs 64 replaces the default" in d for d in plan.decisions)


def _option(argv: list[str], flag: str) -> int:
    return int(argv[argv.index(flag) + 1])


@pytest.mark.parametrize(
    ("slo", "extra", "field", "expected"),
    [
        pytest.param({}, ["--max-num-batched-tokens", "64"], "--max-num-seqs", 64,
                     id="seqs-follow"),
        # A 20 ms ITL target sizes the budget at 256 tokens.
        pytest.param({"itlP95Ms": 20}, ["--max_num_seqs=1024"], "--max-num-batched-tokens", 1024,
                     id="budget-follows"),
        pytest.param({}, ["--max-num-batched-tokens", "65536"], "--max-num-seqs", 256,
                     id="seqs-below-stay"),
    ],
)  # fmt: skip
def test_a_default_follows_the_step_budget_extra_args_give(
    slo: dict[str, float], extra: list[str], field: str, expected: int
) -> None:
    """One bound of vLLM's step budget in extraArgs: the launcher's default of the other moves to
    meet it (else vLLM refuses to start: batched tokens >= sequences), and says so."""
    config = config_of(cfg(slo=slo, runtime={"extraArgs": extra}))
    plan = plan_engine(config, gpu_of("H100:1"))
    assert _option(plan.argv, field) == expected
    tokens, seqs = (_option(plan.argv, f) for f in ("--max-num-batched-tokens", "--max-num-seqs"))
    assert tokens >= seqs
    if expected != 256:
        assert any("vLLM's step budget" in d for d in plan.decisions), plan.decisions


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        pytest.param(["--a_b=1"], [("--a-b", ("1",))], id="underscores-and-equals"),
        pytest.param(["-O3"], [("--optimization-level", ("3",))], id="dash-O-level"),
        pytest.param(["-tp", "2"], [("--tensor-parallel-size", ("2",))], id="short-alias"),
        pytest.param(
            ["--no-enable-prefix-caching"],
            [("--disable-prefix-caching", ())],
            id="old-negation-spelling",
        ),
        pytest.param(["--x", "-1", "--y"], [("--x", ("-1",)), ("--y", ())], id="negative-value"),
        pytest.param(
            ["--lora-modules", "a=1", "b=2"],
            [("--lora-modules", ("a=1", "b=2"))],
            id="several-values",
        ),
    ],
)
def test_split_extra_args(words: list[str], expected: list[tuple[str, tuple[str, ...]]]) -> None:
    assert [(o.flag, o.values) for o in split_args(words)] == expected


def _runtime(**fields: Any) -> dict[str, Any]:
    return cfg(runtime=fields)


@pytest.mark.parametrize(
    ("gpu", "config", "code", "words"),
    [
        pytest.param(
            "H100:2",
            _runtime(tensorParallel=4),
            ExitCode.BAD_PARALLELISM,
            "tensorParallel 4 needs 4 GPUs but this pod has 2 H100",
            id="tp-over-gpus",
        ),
        pytest.param(
            "H100:4",
            _runtime(tensorParallel=3),
            ExitCode.BAD_PARALLELISM,
            "does not divide",
            id="tp-not-dividing",
        ),
        pytest.param(
            "H100:1",
            cfg(role="prefill", kvTransfer={"connector": "MooncakeConnector"}),
            ExitCode.UNKNOWN_KV_CONNECTOR,
            "unknown KV connector 'MooncakeConnector'",
            id="unknown-connector",
        ),
        pytest.param(
            "H100:1",
            cfg(role="decode"),
            ExitCode.UNKNOWN_KV_CONNECTOR,
            "role decode needs kvTransfer.connector",
            id="role-without-connector",
        ),
        pytest.param(
            "H100:1",
            _runtime(maxNumSeqs=32, extraArgs=["--max-num-seqs", "64"]),
            ExitCode.CONFLICTING_ARGS,
            "extraArgs --max-num-seqs 64 contradicts runtime.maxNumSeqs",
            id="extra-vs-spec",
        ),
        pytest.param(
            "H100:1",
            _runtime(prefixCaching=True, extraArgs=["--disable-prefix-caching"]),
            ExitCode.CONFLICTING_ARGS,
            "contradicts runtime.prefixCaching",
            id="extra-negates-spec-switch",
        ),
        pytest.param(
            "H100:1",
            _runtime(extraArgs=["--enforce-eager", "-O3"]),
            ExitCode.CONFLICTING_ARGS,
            "extraArgs set --enforce-eager and --optimization-level 3",
            id="extra-vs-extra",
        ),
        pytest.param(
            "H100:1",
            _runtime(cudaGraphs=True, extraArgs=["-O0"]),
            ExitCode.CONFLICTING_ARGS,
            "extraArgs --optimization-level 0 contradicts runtime.cudaGraphs",
            id="eager-level-vs-graphs-on",
        ),
        pytest.param(
            "H100:2",
            _runtime(extraArgs=["-dp", "2"]),
            ExitCode.CONFLICTING_ARGS,
            "extraArgs ask for 4 GPUs (tensor x data parallel) but a pod has 2",
            id="parallel-beyond-the-gpus",
        ),
        pytest.param(
            "H100:2",
            _runtime(extraArgs=["-tp", "2", "-dp", "2"]),
            ExitCode.CONFLICTING_ARGS,
            "tensor x pipeline x data parallel (2 x 1 x 2) must fit the pod's 2 GPUs",
            id="tensor-by-data-beyond-the-gpus",
        ),
        pytest.param(
            "H100:4",
            _runtime(tensorParallel=4, extraArgs=["-pp", "2"]),
            ExitCode.CONFLICTING_ARGS,
            "tensor x pipeline x data parallel (4 x 2 x 1) must fit the pod's 4 GPUs",
            id="pipeline-beyond-the-gpus",
        ),
        pytest.param(
            "H100:4",
            _runtime(extraArgs=["-pp", "3"]),
            ExitCode.CONFLICTING_ARGS,
            "--pipeline-parallel-size 3 must divide the pod's 4 GPUs",
            id="pipeline-not-dividing",
        ),
        pytest.param(
            "H100:1",
            _runtime(extraArgs=["--port", "9000"]),
            ExitCode.CONFLICTING_ARGS,
            "--port is set by the launcher",
            id="launcher-owned",
        ),
        pytest.param(
            "H100:1",
            _runtime(extraArgs=["--disable-log-stats"]),
            ExitCode.CONFLICTING_ARGS,
            "read engine metrics",
            id="metrics-off-refused",
        ),
        pytest.param(
            "H100:1",
            _runtime(env=[{"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "value": "0.0.0.0"}]),
            ExitCode.BAD_SPEC,
            "runtime.env VLLM_NIXL_SIDE_CHANNEL_HOST: set by the launcher",
            id="launcher-env",
        ),
        pytest.param(
            "H100:1",
            _runtime(extraArgs=["--api-key", "k"]),
            ExitCode.CONFLICTING_ARGS,
            "extraArgs --api-key is refused",
            id="api-key-refused",
        ),
        pytest.param(
            "H100:1",
            _runtime(extraArgs=["--max-num-seqs"]),
            ExitCode.CONFLICTING_ARGS,
            "--max-num-seqs takes one value, not 0",
            id="value-missing",
        ),
        pytest.param(
            "H100:1",
            _runtime(extraArgs=["--gpu-memory-utilization=0"]),
            ExitCode.CONFLICTING_ARGS,
            "--gpu-memory-utilization cannot take 0",
            id="memory-share-zero",
        ),
        pytest.param(
            "H100:1",
            _runtime(maxNumSeqs=512, extraArgs=["--max-num-batched-tokens", "256"]),
            ExitCode.CONFLICTING_ARGS,
            "is below runtime.maxNumSeqs (512)",
            id="budget-below-typed-max-seqs",
        ),
        pytest.param(
            "H100:1",
            _runtime(gpuMemoryUtilization=0.8, extraArgs=["--kv-cache-memory-bytes", "1"]),
            ExitCode.CONFLICTING_ARGS,
            "both size the KV cache",
            id="kv-bytes-beside-memory-share",
        ),
        pytest.param(
            "H100:1",
            _runtime(extraArgs=["fp8"]),
            ExitCode.CONFLICTING_ARGS,
            "must start with an option",
            id="extra-without-option",
        ),
        pytest.param(
            "H100:1",
            _runtime(speculative={"method": "medusa"}),
            ExitCode.BAD_SPEC,
            "unknown speculative method 'medusa'",
            id="unknown-spec-method",
        ),
        pytest.param(
            "H100:1",
            _runtime(speculative={"method": "eagle3"}),
            ExitCode.BAD_SPEC,
            "eagle3 needs speculative.model",
            id="eagle-without-model",
        ),
        pytest.param(
            "H100:1",
            _runtime(quantization="bitsandbytes"),
            ExitCode.BAD_SPEC,
            "unknown quantization 'bitsandbytes'",
            id="quantization-gone-in-0.33",
        ),
        pytest.param(
            "CPU:1",
            _runtime(gpuMemoryUtilization=0.5),
            ExitCode.BAD_SPEC,
            "runtime.gpuMemoryUtilization is a fraction of GPU memory, and this is a CPU engine",
            id="cpu-refuses-a-gpu-fraction",
        ),
        pytest.param(
            "H100:1",
            _runtime(kvCacheDtype="int3"),
            ExitCode.BAD_SPEC,
            "unknown kvCacheDtype 'int3'",
            id="unknown-kv-dtype",
        ),
    ],
)
def test_refused_inputs(gpu: str, config: dict[str, Any], code: ExitCode, words: str) -> None:
    with pytest.raises(LauncherError) as raised:
        plan_engine(config_of(config), gpu_of(gpu))
    assert raised.value.code is code
    assert words in str(raised.value)
    assert "\n" not in str(raised.value)


def test_ttft_and_itl_targets_in_conflict_keep_the_itl_bound() -> None:
    config = cfg(model={**MODEL, "maxModelLen": 131072}, slo={"ttftP95Ms": 500, "itlP95Ms": 50})
    plan = plan_engine(config_of(config), gpu_of("H100:1"))
    options = options_of(plan.argv)
    # ITL bound: 27k tok/s x 25 ms = 675 -> 512. TTFT would need 131072 x 50 / 500 = 13108.
    assert options["--max-num-batched-tokens"] == "512"
    assert any("needs 13108), ITL wins" in line for line in plan.decisions)


def test_calibration_replaces_the_reference_figures() -> None:
    calibrated = {"prefillTokensPerSecond": 100_000, "decodeStepMs": 10}
    config = cfg(slo={"itlP95Ms": 50}, calibration=calibrated)
    options = options_of(plan_engine(config_of(config), gpu_of("H100:1")).argv)
    # 100k tok/s x 25 ms = 2500 -> 2304; (25 - 10) / 0.0462 + 1 = 325 sequences.
    assert options["--max-num-batched-tokens"] == "2304"
    assert options["--max-num-seqs"] == "325"


def test_graphs_on_accepts_another_graph_level() -> None:
    config = cfg(runtime={"cudaGraphs": True, "extraArgs": ["-O3"]})
    options = options_of(plan_engine(config_of(config), gpu_of("H100:1")).argv)
    assert options["--optimization-level"] == "3"


def test_nixl_without_a_pod_ip_warns() -> None:
    config = cfg(role="decode", kvTransfer={"connector": "NixlConnector"})
    plan = plan_engine(config_of(config), gpu_of("H100:1"), pod_ip=None)
    assert "VLLM_NIXL_SIDE_CHANNEL_HOST" not in plan.env
    assert any(line.startswith("WARNING POD_IP is unset") for line in plan.decisions)


@pytest.mark.parametrize(
    ("name", "slo", "calibration", "warned"),
    [
        pytest.param("meta-llama/Llama-3.3-70B-Instruct", {"itlP95Ms": 40}, {}, True, id="70b"),
        pytest.param("Qwen/Qwen2.5-0.5B-Instruct", {"ttftP95Ms": 200}, {}, True, id="0.5b"),
        pytest.param("meta-llama/Llama-3.1-8B-Instruct", {"itlP95Ms": 40}, {}, False, id="8b"),
        pytest.param("meta-llama/Llama-3.3-70B-Instruct", {}, {}, False, id="no-slo"),
        pytest.param("meta-llama/Llama-3.3-70B-Instruct", {"itlP95Ms": 40},
                     {"decodeStepMs": 18.6}, False, id="calibrated"),
        pytest.param("/models/my-model", {"itlP95Ms": 40}, {}, False, id="no-size-in-name"),
    ],
)  # fmt: skip
def test_sizing_warns_outside_the_reference_model_size(
    name: str, slo: dict[str, float], calibration: dict[str, float], warned: bool
) -> None:
    config = {"model": {"name": name}, "slo": slo, "calibration": calibration}
    plan = plan_engine(config_of(config), gpu_of("H100:2"))
    warnings = [line for line in plan.decisions if "8B-model reference" in line]
    assert bool(warnings) is warned
