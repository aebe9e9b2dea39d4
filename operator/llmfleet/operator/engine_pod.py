"""The engine pod's volumes, environment, security contexts and resources (pure).

What vLLM needs to run under Pod Security `restricted` with a read-only root filesystem, and
why each writable place exists:

- `HOME` (emptyDir `home`, `/home/llmfleet`): vLLM's compile cache (`~/.cache/vllm`, torch.compile
  and CUDA-graph artefacts), Triton's kernel cache (`~/.triton`), FlashInfer's JIT cache
  (`~/.cache/flashinfer`), the structured-output grammar caches and vLLM's config directory
  (`~/.config/vllm`) all live under it. The image's own home may not exist for the uid the pod
  runs as, so the pod sets `HOME` itself.
- `/tmp` (emptyDir `tmp`): torch inductor's scratch (`/tmp/torchinductor_<user>`), Python's
  `tempfile`, and the Unix sockets vLLM's engine core and workers talk over (ZMQ IPC paths).
- `HF_HOME` (`model-cache`, `/var/cache/llmfleet/huggingface`): the weights downloaded from
  the hub; an emptyDir per pod, or a PersistentVolumeClaim the pods share (`model.cache`).
- `/dev/shm` (a memory emptyDir `dshm`): NCCL's shared-memory transport and vLLM's
  shared-memory broadcast queue between tensor-parallel workers; the container runtime's
  default of 64 MiB makes a multi-GPU engine fail at its first collective. The kubelet sizes
  this tmpfs at the smaller of its sizeLimit and the pod's memory limit (seen on a real node),
  and what is written there counts against that limit.

Nothing else is needed: no capability (GPUs are device files the device plugin hands to the
container), no host namespace, no privilege escalation. An RDMA KV transfer (UCX over
InfiniBand) would need `IPC_LOCK` to pin memory, which `restricted` forbids; NIXL over TCP
needs nothing.
"""

from __future__ import annotations

from typing import Any

from llmfleet.crds import InferenceService
from llmfleet.crds import labels as L
from llmfleet.crds.pod import quantity
from llmfleet.crds.spec import GpuSpec
from llmfleet.operator.settings import OperatorSettings

HOME_DIR = "/home/llmfleet"
TMP_DIR = "/tmp"
MODEL_CACHE_DIR = "/var/cache/llmfleet/huggingface"
"""`HF_HOME`: the hub cache (weights downloaded from `hf://` sources)."""
MODEL_SOURCE_DIR = "/var/lib/llmfleet/models"
"""Where the claim of a `pvc://<claim>/<path>` source is mounted (read-only), as
`MODEL_SOURCE_DIR/<claim>`; the launcher loads `MODEL_SOURCE_DIR/<claim>/<path>`."""
SHM_DIR = "/dev/shm"
SHM_GIB_PER_GPU = 2
"""Size of /dev/shm per GPU when `runtime.shmSize` is unset: NCCL's buffers between each pair
of local ranks and vLLM's broadcast queue (a few hundred MiB at 8 GPUs), with room to spare."""

# Requests per GPU by GPU type: what the node types that carry them offer per GPU, with room
# for the system (DGX H100/H200/B200: 112-224 cores and 2 TB for 8 GPUs; A100 SXM nodes alike;
# L4 VMs: 8-96 vCPUs and 32-384 GB for 1-8 GPUs). Memory covers the engine process, the
# loading of the weights (read through the page cache), the CPU swap space vLLM keeps, and
# /dev/shm, which the container is charged for.
CPU_PER_GPU = {"H100": 8, "H200": 8, "B200": 8, "A100": 8, "L4": 4}
MEMORY_GIB_PER_GPU = {"H100": 64, "H200": 96, "B200": 96, "A100": 64, "L4": 24}

OPERATOR_ENV = tuple(L.OPERATOR_ENV)
"""What the operator tells the launcher; admission refuses these names in `runtime.env`."""
"""Env names the operator always sets itself; a spec's `runtime.env` cannot replace them."""


def shm_size(service: InferenceService) -> str:
    runtime = service.spec.runtime
    return runtime.shm_size or f"{SHM_GIB_PER_GPU * runtime.gpu.count}Gi"


def resources(service: InferenceService) -> dict[str, Any]:
    """Requests and limits of the engine container: GPUs (or a MIG slice) from `runtime.gpu`,
    CPU and memory per GPU by type (`runtime.resources` replaces them key by key). Memory's
    limit is its request (an engine that grows past it is killed by the kernel rather than
    starving its node); CPU has no limit, as throttling the engine's scheduler thread costs
    every request latency."""
    gpu = service.spec.runtime.gpu
    requests = {
        "cpu": str(CPU_PER_GPU[gpu.type.value] * gpu.count),
        "memory": f"{MEMORY_GIB_PER_GPU[gpu.type.value] * gpu.count}Gi",
    }
    limits: dict[str, str] = {}
    overrides = service.spec.runtime.resources
    if overrides is not None and overrides.requests is not None:
        requests |= overrides.requests.to_wire()
    if overrides is not None and overrides.limits is not None:
        # A limit given alone lowers the derived request to it: the API server refuses a
        # request above its limit, and the user wrote only the limit (admission compares a
        # limit with a request only when both are written).
        given = overrides.requests.to_wire() if overrides.requests is not None else {}
        for key, limit in overrides.limits.to_wire().items():
            if key not in given and quantity(limit) < quantity(requests[key]):
                requests[key] = limit
    limits["memory"] = requests["memory"]
    if overrides is not None and overrides.limits is not None:
        limits |= overrides.limits.to_wire()
    slots = {gpu.resource(): str(gpu.count)}  # whole GPUs, or one MIG slice (`gpu.mig`)
    return {"requests": requests | slots, "limits": limits | slots}


def gpu_affinity(gpu: GpuSpec) -> dict[str, Any]:
    """The node affinity that puts a pod on a GPU `gpu` selects: a node whose product label
    (`nvidia.com/gpu.product` from GFD, or `gpu.nodeLabel`) is one of `gpu.node_products()`.
    The scheduler also needs the node to have the resource free (`resources`), so a MIG pod
    lands only where the device plugin offers its slice. A pool's nodeSelector comes on top."""
    term = {"key": gpu.node_label_key(), "operator": "In", "values": list(gpu.node_products())}
    required = {"nodeSelectorTerms": [{"matchExpressions": [term]}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}


def pvc_source(service: InferenceService) -> tuple[str, str] | None:
    """`(claim, path)` of a `pvc://claim/path` model source; None for any other source."""
    source = service.spec.model.source or ""
    if not source.startswith("pvc://"):
        return None
    claim, _, path = source.removeprefix("pvc://").partition("/")
    return claim, path.strip("/")


def volumes(service: InferenceService) -> list[dict[str, Any]]:
    """The pod's volumes besides the runtime config (see the module docstring)."""
    cache = service.spec.model.cache
    model_cache: dict[str, Any] = {"name": "model-cache"}
    if cache is not None and cache.claim_name is not None:
        model_cache["persistentVolumeClaim"] = {"claimName": cache.claim_name}
    else:
        limit = cache.size_limit if cache is not None else None
        model_cache["emptyDir"] = {"sizeLimit": limit} if limit else {}
    found = [
        {"name": "home", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {}},
        model_cache,
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm_size(service)}},
    ]
    source = pvc_source(service)
    if source is not None:
        found.append(
            {
                "name": "model-source",
                "persistentVolumeClaim": {"claimName": source[0], "readOnly": True},
            }
        )
    return found


def volume_mounts(service: InferenceService) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = [
        {"name": "home", "mountPath": HOME_DIR},
        {"name": "tmp", "mountPath": TMP_DIR},
        {"name": "model-cache", "mountPath": MODEL_CACHE_DIR},
        {"name": "dshm", "mountPath": SHM_DIR},
    ]
    source = pvc_source(service)
    if source is not None:
        mounts.append(
            {
                "name": "model-source",
                "mountPath": f"{MODEL_SOURCE_DIR}/{source[0]}",
                "readOnly": True,
            }
        )
    return mounts


def env(service: InferenceService, settings: OperatorSettings) -> list[dict[str, Any]]:
    """The engine container's env: the pod's writable places, then the spec's `runtime.env`
    (each entry as given: a `valueFrom` stays a reference the kubelet resolves), then what the
    operator tells the launcher. A spec entry replaces a default of the same name."""
    spec_env = [var.to_wire() for var in service.spec.runtime.env]
    for var in spec_env:
        if "valueFrom" in var:
            var.pop("value", None)
    given = {var["name"] for var in spec_env}
    defaults = [
        {"name": "HOME", "value": HOME_DIR},
        {"name": "HF_HOME", "value": MODEL_CACHE_DIR},
        # The image's files are read-only: no bytecode next to them.
        {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
    ]
    ours = [
        {"name": "LLMFLEET_DRAIN_SECONDS", "value": str(settings.drain_seconds)},
        # The KV-transfer side channel (NIXL) advertises the pod's own address.
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        # The launcher's log lines name the pod.
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ]
    spec_env = [var for var in spec_env if var["name"] not in OPERATOR_ENV]
    return [var for var in defaults if var["name"] not in given] + spec_env + ours


def env_from(service: InferenceService) -> list[dict[str, Any]]:
    return [source.to_wire() for source in service.spec.runtime.env_from or []]


def image_pull_secrets(
    service: InferenceService, settings: OperatorSettings
) -> list[dict[str, str]]:
    """The spec's, or the operator's default ones (for the default image) when it gives none."""
    given = service.spec.runtime.image_pull_secrets
    if given is not None:
        return [ref.to_wire() for ref in given]
    return [{"name": name} for name in settings.engine_image_pull_secrets]


def pod_security_context(settings: OperatorSettings) -> dict[str, Any]:
    """Pod Security `restricted`: a non-root uid and gid set explicitly (an image's `User`
    alone left the process in group 0 on a real kubelet), the volumes' group, seccomp."""
    uid = settings.engine_user_id
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "fsGroup": uid,
        # A shared model cache holds many files: change their group only when its root's is
        # wrong, not on every mount.
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
