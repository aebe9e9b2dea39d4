"""Runtime config + GPU -> the `vllm serve` command line and environment. Pure: no I/O.

Each option carries its origin (options.py): the spec, a launcher default decided here with
its reason (the reasons end up in the log), or the launcher itself. `extraArgs` are merged last.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace

from llmfleet.crds import engine_args
from llmfleet.crds.engine_args import (
    BATCHED_TOKENS,
    INTEGER,
    NUM_SEQS,
    PIPELINE_PARALLEL,
    TENSOR_PARALLEL,
    TypedFields,
)
from llmfleet.crds.labels import LAUNCHER_ENV
from llmfleet.runtime import sizing
from llmfleet.runtime.config import Role, RuntimeConfig
from llmfleet.runtime.errors import ExitCode, LauncherError
from llmfleet.runtime.gpu import Gpu
from llmfleet.runtime.options import Option, Origin, merge

CONNECTORS = ("NixlConnector", "LMCacheConnectorV1")
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
# A subset of vLLM 0.33's speculative methods and quantization methods (the fixture test checks
# each is accepted); `bitsandbytes` is gone from vLLM 0.33's list.
SPECULATIVE_METHODS = ("ngram", "eagle", "eagle3", "mtp", "draft_model", "suffix")
NEEDS_DRAFT_MODEL = ("eagle", "eagle3", "draft_model")
QUANTIZATIONS = (
    "fp8",
    "awq",
    "awq_marlin",
    "gptq",
    "gptq_marlin",
    "compressed-tensors",
    "modelopt",
)

# FP8 (E4M3/E5M2) tensor-core support starts at sm_89 (Ada, then Hopper and Blackwell; CUDA C
# Programming Guide). FP8 KV halves the bytes per cached token against bf16, so the same memory
# holds about twice the tokens (more concurrency before preemption, more prefix-cache hits).
FP8_KV_MIN_CAPABILITY = (8, 9)
# The llm-d-benchmark memory measurements our capacity figures come from were taken at 0.9
# (vllm-facts.md: e.g. 51.38 GiB of KV for Llama-3.1-8B on an H100); running at the same
# fraction keeps the autoscaler's KV-capacity assumptions true. vLLM 0.33's default is 0.92.
GPU_MEMORY_UTILIZATION = 0.9
# vLLM 0.33's optimization level with full and piecewise CUDA graphs (its default; -O3 is
# currently identical, OptimizationLevel in vllm/config/vllm.py). Capture costs 10-17 s at start
# (vllm-facts.md), which warm spares hide.
OPTIMIZATION_LEVEL = "2"
CPU_KV_CACHE_GIB = 1
"""A CPU engine's KV cache, GiB of host memory (`--kv-cache-memory-bytes`): a CPU figure. Without
it vLLM's CPU worker sizes the cache as `--gpu-memory-utilization` x the host's RAM (0.9 x RAM
with our GPU default). 1 GiB holds ~32k tokens of the tiny test model; the whole engine then
takes ~3.5 GB (vllm-facts.md). Replace it with extraArgs `--kv-cache-memory-bytes`."""
MODEL_SOURCE_DIR = "/var/lib/llmfleet/models"
"""Where the operator mounts the claim of a `pvc://<claim>/<path>` source (read-only), as
`MODEL_SOURCE_DIR/<claim>` (operator `engine_pod.MODEL_SOURCE_DIR`; a contract test holds the
two together)."""
STREAMED_SOURCES = ("s3://", "gs://")
"""Sources vLLM loads itself, streamed by its Run:ai model streamer."""


@dataclass(frozen=True)
class EnginePlan:
    argv: list[str]
    """`vllm serve MODEL --option …`."""
    env: dict[str, str]
    """Environment the engine needs on top of the launcher's."""
    decisions: list[str] = field(default_factory=list)
    """One line per default chosen or replaced, and `WARNING …` lines, for the log."""
    tensor_parallel: int = 1


def _spec(flag: str, value: str | None, spec_field: str) -> Option:
    return Option(flag, (value,) if value is not None else (), Origin.SPEC, "", spec_field)


def _parallelism(config: RuntimeConfig, gpu: Gpu) -> tuple[int, list[Option]]:
    """The tensor-parallel size and the launcher's parallel options. Without
    `runtime.tensorParallel`, one engine spans the pod's GPUs: with extraArgs' `-pp p` its tensor
    size is `gpu.count / p` (`engine_args.default_tensor_parallel`); the GPUs one engine does not
    take (tensor, extraArgs' `-tp` when given, x pipeline) serve as data-parallel replicas.
    extraArgs replace these defaults; whether their sizes fit is `engine_args.problems`' to say
    (`merge` refuses them)."""
    wanted = config.runtime.tensor_parallel
    words = list(config.runtime.extra_args)
    pipeline = engine_args.first_size(words, PIPELINE_PARALLEL) or 1
    tp = wanted or engine_args.default_tensor_parallel(gpu.count, pipeline)
    if tp > gpu.count:
        raise LauncherError(
            ExitCode.BAD_PARALLELISM,
            f"tensorParallel {tp} needs {tp} GPUs but this pod has {gpu.count} {gpu.type}",
        )
    if gpu.count % tp:
        raise LauncherError(
            ExitCode.BAD_PARALLELISM,
            f"tensorParallel {tp} does not divide the pod's {gpu.count} GPUs",
        )
    over_all = "one engine over all the GPUs"
    if pipeline > 1:
        over_all += f" (gpu.count {gpu.count} / extraArgs {PIPELINE_PARALLEL} {pipeline})"
    options = [
        _spec("--tensor-parallel-size", str(tp), "runtime.tensorParallel")
        if wanted
        else Option("--tensor-parallel-size", (str(tp),), reason=over_all)
    ]
    # The engine's GPUs as vLLM will run it: extraArgs' -tp replaces the tensor size above.
    engine = (engine_args.first_size(words, TENSOR_PARALLEL) or tp) * pipeline
    if gpu.count > engine and gpu.count % engine == 0:
        per_engine = f"tensor x pipeline parallel {engine // pipeline} x {pipeline}"
        options.append(
            Option(
                "--data-parallel-size",
                (str(gpu.count // engine),),
                reason=f"{gpu.count} GPUs / {per_engine}: the rest serve as replicas",
            )
        )
    return tp, options


def _kv_cache(config: RuntimeConfig, gpu: Gpu) -> Option:
    dtype = config.runtime.kv_cache_dtype
    if dtype is not None:
        if dtype not in KV_CACHE_DTYPES:
            raise LauncherError(
                ExitCode.BAD_SPEC,
                f"unknown kvCacheDtype {dtype!r}: use one of {', '.join(KV_CACHE_DTYPES)}",
            )
        return _spec("--kv-cache-dtype", dtype, "runtime.kvCacheDtype")
    if gpu.model.is_cpu:
        return Option("--kv-cache-dtype", ("auto",), reason="a CPU engine: the model's dtype")
    cc = gpu.model.compute_capability
    if cc >= FP8_KV_MIN_CAPABILITY:
        return Option("--kv-cache-dtype", ("fp8",), reason=f"compute capability {cc[0]}.{cc[1]}")
    return Option(
        "--kv-cache-dtype", ("auto",), reason=f"no FP8 on compute capability {cc[0]}.{cc[1]}"
    )


def _speculative(config: RuntimeConfig) -> list[Option]:
    spec = config.runtime.speculative
    if spec is None:
        return []
    if spec.method not in SPECULATIVE_METHODS:
        raise LauncherError(
            ExitCode.BAD_SPEC,
            f"unknown speculative method {spec.method!r}: "
            f"use one of {', '.join(SPECULATIVE_METHODS)}",
        )
    if spec.method in NEEDS_DRAFT_MODEL and not spec.model:
        raise LauncherError(
            ExitCode.BAD_SPEC, f"speculative method {spec.method} needs speculative.model"
        )
    body: dict[str, object] = {"method": spec.method, "num_speculative_tokens": spec.num_tokens}
    if spec.model:
        body["model"] = spec.model
    return [
        _spec(
            "--speculative-config", json.dumps(body, separators=(",", ":")), "runtime.speculative"
        )
    ]


def _kv_transfer(
    config: RuntimeConfig, pod_ip: str | None, warnings: list[str]
) -> tuple[list[Option], dict[str, str]]:
    if config.role is Role.UNIFIED:
        return [], {}
    transfer = config.kv_transfer
    if transfer is None:
        raise LauncherError(
            ExitCode.UNKNOWN_KV_CONNECTOR,
            f"role {config.role} needs kvTransfer.connector ({' or '.join(CONNECTORS)})",
        )
    if transfer.connector not in CONNECTORS:
        raise LauncherError(
            ExitCode.UNKNOWN_KV_CONNECTOR,
            f"unknown KV connector {transfer.connector!r}: use {' or '.join(CONNECTORS)}",
        )
    env: dict[str, str] = {}
    if transfer.connector == "NixlConnector":
        # vLLM's NIXL docs run both sides as kv_both; the request's kv_transfer_params say who
        # sends. The side channel is where the decode side fetches the prefill side's metadata:
        # it must be the pod's routable address, not 127.0.0.1.
        role = "kv_both"
        env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(transfer.side_channel_port)
        if pod_ip:
            env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = pod_ip
        else:
            warnings.append(
                "POD_IP is unset, so VLLM_NIXL_SIDE_CHANNEL_HOST is too: decode pods on other "
                "nodes cannot reach this pod's NIXL side channel (set POD_IP from status.podIP)"
            )
    else:
        # LMCache's disaggregated examples (vLLM examples/others/lmcache) mark the roles.
        role = "kv_producer" if config.role is Role.PREFILL else "kv_consumer"
    body = {"kv_connector": transfer.connector, "kv_role": role}
    value = json.dumps(body, separators=(",", ":"))
    return [_spec("--kv-transfer-config", value, "kvTransfer.connector")], env


def _either(
    flag: str, spec_value: str | None, spec_field: str, default: str, reason: str
) -> Option:
    """The spec's value when it set one, else the launcher's default with its reason."""
    if spec_value is not None:
        return _spec(flag, spec_value, spec_field)
    return Option(flag, (default,), reason=reason)


def _features(config: RuntimeConfig, gpu: Gpu) -> list[Option]:
    rt = config.runtime
    options: list[Option] = []
    if rt.quantization is not None:
        if rt.quantization not in QUANTIZATIONS:
            raise LauncherError(
                ExitCode.BAD_SPEC,
                f"unknown quantization {rt.quantization!r}: use one of {', '.join(QUANTIZATIONS)}",
            )
        options.append(_spec("--quantization", rt.quantization, "runtime.quantization"))
    options.append(_kv_cache(config, gpu))
    if rt.prefix_caching is None:
        # On by default in vLLM V1, but stated so no image default or example can turn it off:
        # the gateway's prefix-affinity routing only pays when engines cache prefixes.
        options.append(Option("--enable-prefix-caching", reason="the gateway routes by prefix"))
    else:
        flag = "--enable-prefix-caching" if rt.prefix_caching else "--disable-prefix-caching"
        options.append(_spec(flag, None, "runtime.prefixCaching"))
    options += (
        _cpu_memory_and_graphs(config) if gpu.model.is_cpu else _gpu_memory_and_graphs(config)
    )
    return options


def _gpu_memory_and_graphs(config: RuntimeConfig) -> list[Option]:
    rt = config.runtime
    utilization = rt.gpu_memory_utilization
    options = [
        _either(
            "--gpu-memory-utilization",
            None if utilization is None else f"{utilization:g}",
            "runtime.gpuMemoryUtilization",
            f"{GPU_MEMORY_UTILIZATION:g}",
            "the fraction our KV-capacity figures were measured at",
        )
    ]
    if rt.cuda_graphs is False:
        options.append(_spec("--enforce-eager", None, "runtime.cudaGraphs"))
    else:
        # `cudaGraphs: true` asks for graphs, not for a level: any level >= 1 honours it, so
        # the level stays a default that extraArgs may replace (engine_args refuses eager).
        reason = "full and piecewise CUDA graphs"
        options.append(Option("--optimization-level", (OPTIMIZATION_LEVEL,), reason=reason))
    return options


def _cpu_memory_and_graphs(config: RuntimeConfig) -> list[Option]:
    """A CPU engine: its KV cache in bytes of host memory, never a fraction of a GPU's (a
    `gpuMemoryUtilization` the spec sets is refused, not dropped); eager mode, there being no
    CUDA graphs to capture. `cudaGraphs: true` is the InferenceService's default, which the
    operator always renders: it cannot mean a choice here, so it is read as "the default"."""
    rt = config.runtime
    if rt.gpu_memory_utilization is not None:
        raise LauncherError(
            ExitCode.BAD_SPEC,
            "runtime.gpuMemoryUtilization is a fraction of GPU memory, and this is a CPU "
            "engine: size its KV cache with extraArgs --kv-cache-memory-bytes",
        )
    kv_bytes = str(CPU_KV_CACHE_GIB * 2**30)
    kv_reason = f"{CPU_KV_CACHE_GIB} GiB of host memory for the KV cache (a CPU figure)"
    options = [Option("--kv-cache-memory-bytes", (kv_bytes,), reason=kv_reason)]
    if rt.cuda_graphs is False:
        options.append(_spec("--enforce-eager", None, "runtime.cudaGraphs"))
    else:
        reason = "a CPU engine has no CUDA graphs (cudaGraphs is moot), and eager starts sooner"
        options.append(Option("--enforce-eager", reason=reason))
    return options


def typed_fields(config: RuntimeConfig, gpu: Gpu) -> TypedFields:
    """What the config's typed fields set (and the pod's GPU count), for the checks of
    extraArgs against them."""
    rt, model = config.runtime, config.model
    return TypedFields(
        max_model_len=model.max_model_len,
        revision=model.revision,
        tensor_parallel=rt.tensor_parallel,
        quantization=rt.quantization,
        kv_cache_dtype=rt.kv_cache_dtype,
        prefix_caching=rt.prefix_caching,
        chunked_prefill=rt.chunked_prefill.enabled,
        max_batched_tokens=rt.chunked_prefill.max_batched_tokens,
        max_num_seqs=rt.max_num_seqs,
        gpu_memory_utilization=rt.gpu_memory_utilization,
        cuda_graphs=rt.cuda_graphs,
        speculative=rt.speculative is not None,
        kv_transfer=config.role is not Role.UNIFIED,
        gpu_count=gpu.count,
        streamed_source=(model.source or "").startswith(STREAMED_SOURCES),
    )


def _batching(config: RuntimeConfig, gpu: Gpu, tp: int) -> list[Option]:
    rt = config.runtime
    plan = sizing.plan_sizing(config, gpu, tp)
    chunked = rt.chunked_prefill
    options: list[Option] = []
    if chunked.enabled:
        reason = "long prompts do not stall running decodes"
        options.append(Option("--enable-chunked-prefill", reason=reason))
    else:
        options.append(_spec("--disable-chunked-prefill", None, "runtime.chunkedPrefill.enabled"))
    if plan.max_batched_tokens is not None:
        tokens = str(plan.max_batched_tokens)
        spec_tokens = tokens if chunked.max_batched_tokens is not None else None
        field_name = "runtime.chunkedPrefill.maxBatchedTokens"
        reason = plan.batched_tokens_reason
        options.append(_either("--max-num-batched-tokens", spec_tokens, field_name, tokens, reason))
    seqs = None if rt.max_num_seqs is None else str(rt.max_num_seqs)
    default, reason = str(plan.max_num_seqs), plan.max_num_seqs_reason
    options.append(_either("--max-num-seqs", seqs, "runtime.maxNumSeqs", default, reason))
    return options


def model_to_load(config: RuntimeConfig) -> tuple[str, list[Option]]:
    """What `vllm serve` loads, from `model.source`: the hub repository of `hf://org/model`, the
    mounted directory of `pvc://claim/path`, an `s3://`/`gs://` URL as is (with the streamer's
    load format), or `model.name` without a source."""
    model = config.model
    source = model.source or ""
    if source.startswith("hf://"):
        return source.removeprefix("hf://"), []
    if source.startswith("pvc://"):
        claim, _, path = source.removeprefix("pvc://").partition("/")
        return "/".join(part for part in (MODEL_SOURCE_DIR, claim, path.strip("/")) if part), []
    if source.startswith(STREAMED_SOURCES):
        return source, [_spec("--load-format", "runai_streamer", "model.source")]
    if source:
        raise LauncherError(
            ExitCode.BAD_SPEC,
            f"model.source {source!r}: use hf://, pvc://, s3:// or gs://",
        )
    return model.name, []


def _defaults_follow_extra_args(ours: list[Option], words: list[str]) -> list[Option]:
    """vLLM's step budget holds every running sequence (`--max-num-batched-tokens` >=
    `--max-num-seqs`, or it refuses to start). When extraArgs give one of the two and the other
    is the launcher's default, the default follows the given number, so that a user who sets
    one bound is not refused over the other's default (a typed field does not move: admission
    refuses that pair, `engine_args.engine_limits`)."""
    try:
        args = engine_args.split(words)
    except engine_args.ArgsError:
        return ours  # `merge` refuses these words
    given: dict[str, int] = {}
    for arg in args:
        value = engine_args.first_value(arg)
        if arg.flag in (BATCHED_TOKENS, NUM_SEQS) and re.match(INTEGER, value):
            given.setdefault(arg.flag, int(value))
    tokens, seqs = given.get(BATCHED_TOKENS), given.get(NUM_SEQS)

    def follow(option: Option) -> Option:
        value = option.values[0] if option.values else ""
        if option.origin is not Origin.DEFAULT or re.match(INTEGER, value) is None:
            return option
        if option.flag == NUM_SEQS and tokens is not None and int(value) > tokens:
            reason = f"at most extraArgs {BATCHED_TOKENS} {tokens} (vLLM's step budget)"
            return replace(option, values=(str(tokens),), reason=reason)
        if option.flag == BATCHED_TOKENS and seqs is not None and int(value) < seqs:
            reason = f"at least extraArgs {NUM_SEQS} {seqs} (vLLM's step budget)"
            return replace(option, values=(str(seqs),), reason=reason)
        return option

    return [follow(option) for option in ours]


def plan_engine(config: RuntimeConfig, gpu: Gpu, pod_ip: str | None = None) -> EnginePlan:
    """The whole engine command line for this pod. Raises LauncherError on invalid input."""
    model = config.model
    tp, parallel = _parallelism(config, gpu)
    to_load, load_options = model_to_load(config)
    launcher = [
        # The engine serves the pod's port itself: the pool Service targets it directly.
        Option("--host", (config.serving.host,), Origin.LAUNCHER),
        Option("--port", (str(config.serving.port),), Origin.LAUNCHER),
        Option("--served-model-name", (model.served_name or model.name,), Origin.LAUNCHER),
        # vLLM 0.33 can itself wait for in-flight requests on SIGTERM (0 = abort them). The
        # launcher has drained before it signals the engine: whatever is left has outlived the
        # grace period and must go, and a second grace would overrun the pod's.
        Option("--shutdown-timeout", ("0",), Origin.LAUNCHER),
    ]
    if model.max_model_len is not None:
        launcher.append(_spec("--max-model-len", str(model.max_model_len), "model.maxModelLen"))
    if model.revision is not None:
        launcher.append(_spec("--revision", model.revision, "model.revision"))
    warnings = [w for w in (sizing.reference_warning(config, gpu),) if w]
    kv_options, env = _kv_transfer(config, pod_ip, warnings)
    ours = (
        launcher
        + parallel
        + _features(config, gpu)
        + _batching(config, gpu, tp)
        + _speculative(config)
        + kv_options
        + load_options
    )
    ours = _defaults_follow_extra_args(ours, list(config.runtime.extra_args))
    decisions = [f"{' '.join(o.words())}: {o.reason}" for o in ours if o.origin is Origin.DEFAULT]
    merged = merge(ours, list(config.runtime.extra_args), typed_fields(config, gpu), decisions)
    # Admission refuses these names (`labels.LAUNCHER_ENV`); this is the last line.
    taken = [var.name for var in config.runtime.env if var.name in LAUNCHER_ENV]
    if taken:
        raise LauncherError(
            ExitCode.BAD_SPEC,
            f"runtime.env {', '.join(taken)}: set by the launcher for the engine "
            f"({LAUNCHER_ENV[taken[0]]})",
        )
    for var in config.runtime.env:
        env[var.name] = var.value
    argv = ["vllm", "serve", to_load]
    for option in merged:
        argv += option.words()
    return EnginePlan(argv, env, decisions + [f"WARNING {w}" for w in warnings], tp)
