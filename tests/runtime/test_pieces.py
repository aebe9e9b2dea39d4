"""Small pure pieces of the runtime: metrics parsing, warm-up bodies, GPU names, the Dockerfile."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from llmfleet.runtime.config import GpuConfig, Warmup
from llmfleet.runtime.errors import ExitCode, LauncherError
from llmfleet.runtime.gpu import detect, type_from_device_name
from llmfleet.runtime.metrics import kv_cache_tokens, requests_in_engine
from llmfleet.runtime.warmup import warmup_requests

REPO = Path(__file__).resolve().parents[2]

VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting_by_reason{reason="capacity"} 9.0
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(VLLM_METRICS, 6, id="sums-engines-ignores-similar-names"),
        pytest.param("vllm:num_requests_running 0\n", 0, id="idle-no-labels"),
        pytest.param('vllm:num_requests_waiting{m="x"} NaN\n', None, id="nan-is-unknown"),
        pytest.param("# nothing here\nprocess_cpu_seconds_total 4\n", None, id="not-an-engine"),
    ],
)
def test_requests_in_engine(text: str, expected: int | None) -> None:
    assert requests_in_engine(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param('vllm:cache_config_info{block_size="16",cache_dtype="fp8",'
                     'num_gpu_blocks="26306",enable_prefix_caching="True"} 1.0\n', 420896,
                     id="vllm-info-labels"),
        pytest.param('vllm:cache_config_info{block_size="16"} 1.0\n', None, id="no-block-count"),
        pytest.param(VLLM_METRICS, None, id="absent"),
    ],
)  # fmt: skip
def test_kv_cache_tokens(text: str, expected: int | None) -> None:
    assert kv_cache_tokens(text) == expected


def test_warmup_sends_system_prompts_first_and_streams_once() -> None:
    warmup = Warmup(system_prompts=["You are A.", "You are B."], requests=3, max_tokens=5)
    bodies = warmup_requests("served", warmup)
    assert [b["messages"][0]["content"] for b in bodies[:2]] == ["You are A.", "You are B."]
    assert [b["messages"][0]["role"] for b in bodies] == ["system"] * 2 + ["user"] * 3
    assert sum(bool(b.get("stream")) for b in bodies) == 1
    assert {b["model"] for b in bodies} == {"served"}
    assert {b["max_tokens"] for b in bodies} == {5}


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param("NVIDIA H100 80GB HBM3", "H100", id="h100-sxm"),
        pytest.param("NVIDIA H100 NVL", "H100", id="h100-nvl"),
        pytest.param("NVIDIA H200", "H200", id="h200"),
        pytest.param("NVIDIA B200", "B200", id="b200"),
        pytest.param("NVIDIA A100-SXM4-80GB", "A100", id="a100"),
        pytest.param("NVIDIA L4", "L4", id="l4"),
    ],
)
def test_device_names(name: str, expected: str) -> None:
    assert type_from_device_name(name) == expected


@pytest.mark.parametrize("name", ["NVIDIA L40S", "Tesla V100-SXM2-16GB", "AMD Instinct MI300X"])
def test_unknown_device_names(name: str) -> None:
    with pytest.raises(LauncherError) as raised:
        type_from_device_name(name)
    assert raised.value.code is ExitCode.UNKNOWN_GPU


def test_dockerfile_pins_the_vllm_of_the_runtime_extra_and_runs_the_launcher_as_non_root() -> None:
    """The launcher lives in a venv of its own: every pip install names that venv's Python, so
    vLLM's own Python and packages stay as vLLM built them (tests/images checks the rest of the
    file against the image's recipe)."""
    dockerfile = (REPO / "runtime_image" / "Dockerfile").read_text()
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    pin = next(p for p in pyproject["project"]["optional-dependencies"]["runtime"] if "vllm" in p)
    version = pin.split("==")[1]
    assert re.search(rf"^FROM vllm/vllm-openai:v{re.escape(version)}$", dockerfile, re.MULTILINE)
    assert re.search(r"^USER 10001:10001$", dockerfile, re.MULTILINE)
    assert 'ENTRYPOINT ["/opt/llmfleet/bin/llmfleet-runtime"]' in dockerfile
    installs = re.findall(r"pip (.*?) install", dockerfile)
    assert installs, "the launcher is installed with pip"
    assert all(options == "--python /opt/llmfleet/bin/python" for options in installs), installs
    assert ".[runtime]" not in dockerfile  # never the whole control plane into vLLM's Python
    for download in ("huggingface-cli", "hf download", "snapshot_download", "wget", "curl"):
        assert download not in dockerfile, f"the image must not fetch weights at build ({download})"


@pytest.mark.parametrize(
    ("environ", "probed", "expected"),
    [
        pytest.param({}, None, ("H100", 2, "config"), id="config-without-torch"),
        pytest.param({}, ("NVIDIA H200", 8), ("H200", 8, "torch"), id="torch-wins-over-config"),
        pytest.param({"LLMFLEET_RUNTIME_GPU": "L4:1"}, ("NVIDIA H200", 8), ("L4", 1, "env"),
                     id="env-wins-over-torch"),
        pytest.param({"LLMFLEET_RUNTIME_GPU": "b200"}, None, ("B200", 2, "env"),
                     id="env-type-only-keeps-count"),
    ],
)  # fmt: skip
def test_gpu_detection_order(
    environ: dict[str, str], probed: tuple[str, int] | None, expected: tuple[str, int, str]
) -> None:
    gpu = detect(GpuConfig(type="H100", count=2), environ, probe=lambda: probed)
    assert (gpu.type, gpu.count, gpu.source) == expected


def test_a_gpu_torch_finds_but_we_do_not_know_is_refused() -> None:
    with pytest.raises(LauncherError) as raised:
        detect(GpuConfig(), {}, probe=lambda: ("NVIDIA L40S", 4))
    assert raised.value.code is ExitCode.UNKNOWN_GPU
    assert "LLMFLEET_RUNTIME_GPU" in str(raised.value)
