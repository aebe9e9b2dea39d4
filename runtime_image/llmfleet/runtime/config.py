"""The runtime config: what the operator renders into each pool's ConfigMap and the launcher reads.

One file per pool (YAML or JSON, camelCase keys like the `InferenceService` they come from): the
service's `spec.model` and `spec.runtime`, the pool's role, the KV transfer of a disaggregated
service, the SLO targets, the warm-up and the ports. Field names follow DESIGN.md §3.

Values a person can get wrong in a way the launcher must name (an unknown GPU type or KV
connector) are plain strings here and checked by the argument builder, so each gets its own
message and exit code instead of a generic schema error.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from llmfleet.runtime.errors import ExitCode, LauncherError


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        use_attribute_docstrings=True,
        extra="forbid",
        frozen=True,
    )


class Role(StrEnum):
    UNIFIED = "unified"
    PREFILL = "prefill"
    DECODE = "decode"


class ModelConfig(_Model):
    name: Annotated[str, Field(min_length=1)]
    """Model identifier (`meta-llama/Llama-3.1-8B-Instruct`) or a local path to its weights."""
    served_name: str | None = None
    """Name clients send in the OpenAI `model` field; defaults to `name`."""
    max_model_len: Annotated[int, Field(ge=16)] | None = None
    """Longest context (prompt + output tokens); the model's own limit when unset."""
    revision: str | None = None
    """Hub revision to load."""
    source: str | None = None
    """Where the weights come from: `hf://org/model` (that repository, downloaded into the
    pod's `HF_HOME`), `pvc://claim/path` (the directory the operator mounts read-only),
    `s3://…` or `gs://…` (streamed by vLLM); `name` from the hub when unset."""


class GpuConfig(_Model):
    type: str = "H100"
    """GPU model the pod was scheduled on (H100, H200, B200, A100, L4), or CPU for vLLM's CPU
    build (no GPU: KV cache in host memory, eager mode, vLLM's CPU batching defaults)."""
    count: Annotated[int, Field(ge=1, le=8)] = 1
    """GPUs in the pod."""


class ChunkedPrefill(_Model):
    enabled: bool = True
    """Split long prompts into chunks batched with decodes."""
    max_batched_tokens: Annotated[int, Field(ge=64)] | None = None
    """Token budget per engine step; sized from the SLO targets when unset."""


class Speculative(_Model):
    method: str
    """vLLM speculative method: ngram, eagle, eagle3, mtp, draft_model or suffix."""
    model: str | None = None
    """Draft or EAGLE head model (draft_model, eagle and eagle3 need one)."""
    num_tokens: Annotated[int, Field(ge=1, le=16)] = 3
    """Tokens proposed per step."""


class EnvVar(_Model):
    name: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
    value: str = ""


class Runtime(_Model):
    image: str | None = None
    """The image the pod runs (the operator's concern; accepted so spec.runtime passes as is)."""
    engine: Literal["vllm"] = "vllm"
    """Only `vllm`."""
    gpu: GpuConfig = GpuConfig()
    """GPU type and count per pod."""
    tensor_parallel: Annotated[int, Field(ge=1)] | None = None
    """Tensor-parallel size; the GPU count when unset."""
    quantization: str | None = None
    """Weight quantization method passed to `--quantization` (fp8, awq, gptq, …)."""
    kv_cache_dtype: str | None = None
    """KV-cache precision (auto, fp8, fp8_e4m3, fp8_e5m2); fp8 on compute capability >= 8.9
    when unset."""
    prefix_caching: bool | None = None
    """Reuse KV blocks of shared prefixes; on when unset."""
    chunked_prefill: ChunkedPrefill = ChunkedPrefill()
    """Chunked prefill and its per-step token budget."""
    cuda_graphs: bool | None = None
    """Capture CUDA graphs; on when unset (off means `--enforce-eager`)."""
    speculative: Speculative | None = None
    """Speculative decoding; off when unset."""
    max_num_seqs: Annotated[int, Field(ge=1)] | None = None
    """Most concurrent sequences; sized from the ITL target when unset."""
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] | None = None
    """Fraction of GPU memory vLLM may use."""
    extra_args: list[str] = []
    """Extra `vllm serve` arguments; they replace the launcher's defaults for the same option
    and are refused when they contradict a field set above."""
    env: list[EnvVar] = []
    """Extra environment variables for the engine process."""


class KvTransfer(_Model):
    connector: str = "NixlConnector"
    """NixlConnector or LMCacheConnectorV1."""
    side_channel_port: Annotated[int, Field(ge=1, le=65535)] = 5600
    """NIXL handshake port (vLLM's default, `VLLM_NIXL_SIDE_CHANNEL_PORT`)."""


class Slo(_Model):
    ttft_p95_ms: Annotated[float, Field(gt=0)] | None = None
    """Target p95 time to first token, ms."""
    itl_p95_ms: Annotated[float, Field(gt=0)] | None = None
    """Target p95 inter-token latency, ms."""
    max_kv_cache_usage: Annotated[float, Field(gt=0, le=1)] | None = None
    """The autoscaler's saturation threshold (not used by the launcher)."""


class Calibration(_Model):
    """Measured engine speed (from a capacity profile) that replaces the reference figures the
    launcher otherwise scales by GPU type."""

    prefill_tokens_per_second: Annotated[float, Field(gt=0)] | None = None
    """Prompt tokens per second one engine prefills (all its GPUs together)."""
    decode_step_ms: Annotated[float, Field(gt=0)] | None = None
    """Duration of a decode step at low concurrency, ms."""


class Warmup(_Model):
    system_prompts: list[str] = []
    """The service's system prompts; each is sent once so its KV blocks are cached."""
    requests: Annotated[int, Field(ge=0, le=64)] = 2
    """Further short requests (beyond the system prompts) before the pod is ready."""
    max_tokens: Annotated[int, Field(ge=1, le=256)] = 8
    """Tokens each warm-up request generates (enough to run decode steps, cheap)."""
    timeout_seconds: Annotated[float, Field(gt=0)] = 120.0
    """Budget for the whole warm-up."""


class Serving(_Model):
    port: Annotated[int, Field(ge=1, le=65535)] = 8000
    """Port the engine serves the OpenAI API and `/metrics` on: the pod's serving port, which
    the pool Service targets directly (no proxy in the pod)."""
    launcher_port: Annotated[int, Field(ge=1, le=65535)] = 8001
    """The launcher's side port: readiness (`/ready`) and the drain (`/drain`, the pod's preStop
    hook). It carries no requests."""
    host: Literal["0.0.0.0", "127.0.0.1"] = "0.0.0.0"
    """Address the engine and the side port bind: every address of the pod, or loopback only
    (tests). The launcher itself reaches the engine on 127.0.0.1 either way."""
    startup_timeout_seconds: Annotated[float, Field(gt=0)] = 1800.0
    """How long the engine may take to become healthy (weights download and load, graph
    capture: 1.5-5 min typical, vllm-facts.md; large models far longer)."""
    drain_grace_seconds: Annotated[float, Field(ge=0)] = 30.0
    """From the start of the drain (preStop hook or SIGTERM), how long in-flight requests may
    run before they are cut off; keep it below the pod's terminationGracePeriodSeconds
    (Kubernetes' default is 30 s)."""
    drain_settle_seconds: Annotated[float, Field(ge=0)] = 3.0
    """How long the drain waits at least, idle or not: the time for the pod's removal from the
    EndpointSlices to reach every client (the gateway lists them every second), so a request
    sent meanwhile still finds the engine up, and is waited for."""
    engine_stop_seconds: Annotated[float, Field(gt=0)] = 10.0
    """After SIGTERM, how long the engine may take to exit before SIGKILL: vLLM frees GPU memory
    and joins its worker processes on shutdown, which takes a few seconds on multi-GPU engines."""

    @model_validator(mode="after")
    def _distinct_ports(self) -> Serving:
        if self.port == self.launcher_port:
            raise ValueError(f"port and launcherPort are both {self.port}")
        return self


class RuntimeConfig(_Model):
    """The whole file. Only `model.name` is required."""

    model: ModelConfig
    role: Role = Role.UNIFIED
    """unified, prefill or decode."""
    service: str | None = None
    """The InferenceService's name (in every log line)."""
    namespace: str | None = None
    """Its namespace (in every log line)."""
    port: Annotated[int, Field(ge=1, le=65535)] | None = None
    """The engine's port as the operator renders it (its container port `http`); replaces
    `serving.port`."""
    launcher_port: Annotated[int, Field(ge=1, le=65535)] | None = None
    """The side port as the operator renders it (its container port `launcher`, which the
    readiness probe and the preStop hook use); replaces `serving.launcherPort`."""
    runtime: Runtime = Runtime()
    kv_transfer: KvTransfer | None = None
    """KV transfer between prefill and decode pools; required for those roles."""
    slo: Slo = Slo()
    calibration: Calibration = Calibration()
    warmup: Warmup = Warmup()
    serving: Serving = Serving()


DRAIN_ENV = "LLMFLEET_DRAIN_SECONDS"


def load_config(path: Path, environ: Mapping[str, str] | None = None) -> RuntimeConfig:
    """Read a runtime config file (YAML, of which JSON is a subset); one-line errors."""
    environ = {} if environ is None else environ
    try:
        text = path.read_text()
    except OSError as error:
        raise LauncherError(
            ExitCode.BAD_CONFIG, f"cannot read config {path}: {error.strerror}"
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise LauncherError(
            ExitCode.BAD_CONFIG, f"config {path} is not valid YAML/JSON{where}"
        ) from None
    if not isinstance(data, dict):
        raise LauncherError(ExitCode.BAD_CONFIG, f"config {path} must be a mapping")
    try:
        config = RuntimeConfig.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "(top level)"
        more = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
        raise LauncherError(
            ExitCode.BAD_CONFIG, f"config {path}: {field}: {first['msg']}{more}"
        ) from None
    return with_overrides(config, environ)


def with_overrides(config: RuntimeConfig, environ: Mapping[str, str]) -> RuntimeConfig:
    """Fold in the top-level `port` and `launcherPort` and the operator's
    `LLMFLEET_DRAIN_SECONDS` env var (the drain grace it also sized the pod's
    terminationGracePeriodSeconds from)."""
    ports = {"port": config.port, "launcher_port": config.launcher_port}
    overrides: dict[str, object] = {k: v for k, v in ports.items() if v is not None}
    drain = environ.get(DRAIN_ENV)
    if drain:
        try:
            seconds = float(drain)
        except ValueError:
            raise LauncherError(
                ExitCode.BAD_CONFIG, f"{DRAIN_ENV}={drain!r} is not a number of seconds"
            ) from None
        overrides["drain_grace_seconds"] = seconds
    try:
        # Validated again: the overrides must agree with each other and with the file.
        serving = Serving.model_validate(config.serving.model_dump() | overrides)
    except ValidationError as error:
        message = error.errors()[0]["msg"]
        raise LauncherError(ExitCode.BAD_CONFIG, f"serving, with overrides: {message}") from None
    return config.model_copy(update={"serving": serving})
