"""`InferenceService.spec`: model, runtime, topology, slo, autoscaling, traffic, rollout.

Bounds and enums are plain pydantic constraints (the renderer turns them into the CRD's
structural schema); cross-field rules are `Rule`s (CEL for the API server, Python for us).
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from llmfleet.crds import labels as L
from llmfleet.crds._base import ApiModel, Rule, cel_string, defaulted
from llmfleet.crds.gpus import (
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    GPU_TYPES,
    mig_memory_gb,
    mig_resource,
)
from llmfleet.crds.pod import (
    EnvFromSource,
    EnvVarSource,
    LocalRef,
    ModelCache,
    Quantity,
    ResourceOverrides,
)

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
MAX_EXACT_INTEGER = 2**53 - 1
"""The bound of counts that have no natural one: the largest integer a float64 holds exactly.
The API server checks a schema's bounds as float64, and refuses one that is not an integer
there (2**63 - 1 becomes 9.223372036854776e18, past int64), so int64's own limit cannot be
stated."""
MAX_TOKENS = 10_485_760
"""The longest context (in tokens) the API accepts; token counts are bounded by it."""
LABEL_KEY = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
"""A Kubernetes label key (or taint key): an optional DNS-subdomain prefix and `/`, then a name."""
QUALIFIED_KEY = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
"""A label key with its name part's bound (63 characters); the prefix's (253) is checked apart."""
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
"""A Kubernetes label value (or taint value), empty or at most 63 characters."""
LabelValue = Annotated[str, Field(pattern=LABEL_VALUE, max_length=63)]
PVC_SOURCE = r"^pvc://[a-z0-9]([-a-z0-9.]*[a-z0-9])?(/[^/]+)*/?$"
"""`pvc://<claim>[/<path>]`: a PersistentVolumeClaim name, then a path inside it."""
_COMPONENT = "[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*"
_HOST = "[a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?"
IMAGE_REFERENCE = (
    f"^((localhost|{_HOST}([.]{_HOST})+)(:[0-9]+)?/|{_HOST}:[0-9]+/)?"
    f"{_COMPONENT}(/{_COMPONENT})*"
    "(:[A-Za-z0-9_][-A-Za-z0-9_.]{0,127})?"
    "(@[A-Za-z][A-Za-z0-9]*([-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$"
)
"""An image reference as the kubelet parses it (the distribution reference grammar): an optional
registry (with a dot or a port, or `localhost`), lowercase path components, a tag, a digest."""
HUB_REPO = r"[A-Za-z0-9_.][-A-Za-z0-9_.]*(/[A-Za-z0-9_.][-A-Za-z0-9_.]*)?"
"""A hub repository id as vLLM and the hub read one: `org/name` (or `name`), letters, digits,
`-`, `_` and `.`; no scheme, no spaces, no `@revision` (that is `model.revision`)."""
MODEL_TO_LOAD = rf"^({HUB_REPO}|/[^ \t\n\r\f\v]*)$"
"""What `vllm serve` loads as `model.name` without a source: a hub repository id, or an absolute
path in the image (weights baked into a custom `runtime.image`)."""
REVISION = r"^[^ \t\n\r\f\v~^?*\[\\]+$"
"""A hub revision (branch, tag or commit): no whitespace, none of `~^?*[\\` (git refuses them in
a ref name)."""
DIGEST = r"@(sha256:[a-f0-9]{64}|sha384:[a-f0-9]{96}|sha512:[a-f0-9]{128})$"
"""A digest as the kubelet parses one (distribution's reference, with go-digest's algorithms):
sha256, sha384 or sha512, each with its number of lowercase hex digits; any other refused."""
IMAGE_NAME_MAX = 255
"""Characters an image's name may have as the kubelet reads it (`image_name_length`): it refuses
a longer one ("repository name must not be more than 255 characters")."""
REGISTRY_FIRST = r"^(localhost|[^/]*[.:][^/]*)/"
"""A name whose first component is a registry (a dot or a port in it, or `localhost`)."""


def image_name_length(image: str) -> int:
    """The length of `image`'s name as the kubelet checks it (distribution's
    `ParseNormalizedNamed`): the registry and path without tag and digest, after naming Docker
    Hub's registry (`docker.io/`, for `index.docker.io` too) and its `library/` for a one-part
    path there (`ubuntu` is `docker.io/library/ubuntu`)."""
    ref = image.split("@", maxsplit=1)[0]
    name = ref[: ref.rfind(":")] if ref.rfind(":") > ref.rfind("/") else ref
    if re.match(REGISTRY_FIRST, name) is None:
        return len("docker.io/") + len(name) + (0 if "/" in name else len("library/"))
    length = len(name) - (len("index.docker.io") - len("docker.io")) * name.startswith(
        "index.docker.io/"
    )
    hub = name.startswith(("docker.io/", "index.docker.io/"))
    return length + (len("library/") if hub and "/" not in name.partition("/")[2] else 0)


def _image_name_length_cel() -> str:
    """CEL: `image_name_length(self.image)` (no `let`: the name is spelt out where used)."""
    ref = "self.image.split('@')[0]"
    tag = f"{ref}.lastIndexOf(':')"
    name = f"({tag} > {ref}.lastIndexOf('/') ? {ref}.substring(0, {tag}) : {ref})"
    hub = f"({name}.startsWith('docker.io/') || {name}.startsWith('index.docker.io/'))"
    library = f"({hub} && !{name}.substring({name}.indexOf('/') + 1).contains('/') ? 8 : 0)"
    return (
        f"({name}.matches({cel_string(REGISTRY_FIRST)}) ? "
        f"size({name}) - ({name}.startsWith('index.docker.io/') ? 6 : 0) + {library} : "
        f"size({name}) + 10 + ({name}.contains('/') ? 0 : 8))"
    )


IMAGE_ID = r"^[a-f0-9]{64}$"
"""64 lowercase hex digits alone: the kubelet refuses them as a name to pull ("cannot specify
64-byte hexadecimal strings": they read as a local image ID)."""
RENDERED_TEXT_MAX = 65_536
"""Characters `runtime.env` values and `runtime.extraArgs` may hold together. The operator copies
them into each pool's runtime config (a ConfigMap of at most 1 MiB, holding up to four pools'
configs while a canary or a topology change runs) and into the status's stable spec."""


class ModelSpec(ApiModel):
    name: Annotated[str, Field(min_length=1, max_length=256)]
    """Model identifier, e.g. `meta-llama/Llama-3.1-8B-Instruct`."""
    source: Annotated[str, Field(pattern=r"^(hf|pvc|s3|gs)://.+", max_length=1024)] | None = None
    """Where the weights come from. `hf://org/model`: that hub repository, downloaded into the
    model cache (`cache`). `pvc://claim/path`: a directory of a PersistentVolumeClaim in the
    service's namespace, mounted read-only (nothing is downloaded). `s3://…` and `gs://…`: given
    to vLLM as the model, streamed by its Run:ai model streamer (credentials through `env`).
    Defaults to `hf://<name>`."""
    cache: ModelCache | None = None
    """Where downloaded weights are kept; an emptyDir per pod when unset."""
    revision: Annotated[str, Field(max_length=128)] | None = None
    """Hub revision (branch, tag or commit) to pin; the default branch when unset."""
    served_name: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    """Model name clients send in the OpenAI `model` field; defaults to `name`."""
    max_model_len: Annotated[int, Field(ge=16, le=MAX_TOKENS)] | None = None
    """Maximum context length (prompt + output tokens); the model's own limit when unset.
    Required when chunked prefill is off and `runtime.chunkedPrefill.maxBatchedTokens` is set
    (that budget must hold a whole prompt)."""

    rules = (
        Rule(
            cel="!has(self.source) || !self.source.startsWith('pvc://') || "
            f"self.source.matches('{PVC_SOURCE}')",
            message="a pvc:// source is pvc://<claim>/<path>: the claim a PersistentVolumeClaim "
            "name (lowercase letters, digits, '-' and '.'), then the directory of the weights",
            field_path=".source",
            check=lambda m: (
                m.source is None
                or not m.source.startswith("pvc://")
                or re.match(PVC_SOURCE, m.source) is not None
            ),
        ),
        Rule(
            cel="!has(self.source) || !self.source.startsWith('pvc://') || "
            "!self.source.matches('/[.][.]?(/|$)')",
            message="a pvc:// source's path may not hold '.' or '..' segments: the weights are "
            "a directory inside the claim",
            field_path=".source",
            check=lambda m: (
                m.source is None
                or not m.source.startswith("pvc://")
                or re.search("/[.][.]?(/|$)", m.source) is None
            ),
        ),
        Rule(
            cel=f"has(self.source) || self.name.matches({cel_string(MODEL_TO_LOAD)})",
            message="model.name is what vllm serve loads when model.source is unset, so it must be "
            "a hub repository id (org/name: letters, digits, '-', '_', '.'; no scheme, spaces or "
            "@revision) or an absolute path in the image: set model.source for weights from "
            "elsewhere, model.revision for a revision",
            field_path=".name",
            check=lambda m: m.source is not None or re.match(MODEL_TO_LOAD, m.name) is not None,
        ),
        Rule(
            cel="!has(self.source) || !self.source.startsWith('hf://') || "
            "self.source.matches(" + cel_string(f"^hf://{HUB_REPO}$") + ")",
            message="an hf:// source is hf://<org>/<name>, a hub repository id (letters, digits, "
            "'-', '_', '.'): a revision goes in model.revision",
            field_path=".source",
            check=lambda m: (
                m.source is None
                or not m.source.startswith("hf://")
                or re.match(f"^hf://{HUB_REPO}$", m.source) is not None
            ),
        ),
        Rule(
            cel=f"!has(self.revision) || self.revision.matches({cel_string(REVISION)})",
            message="model.revision is a branch, tag or commit of the hub repository: no "
            "spaces, none of ~^?*[\\",
            field_path=".revision",
            check=lambda m: m.revision is None or re.match(REVISION, m.revision) is not None,
        ),
        Rule(
            cel="!has(self.revision) || !has(self.source) || self.source.startsWith('hf://')",
            message="model.revision pins a hub revision, and model.source is not the hub "
            "(pvc://, s3:// and gs:// sources are read as they are): remove revision",
            field_path=".revision",
            check=lambda m: m.revision is None or m.source is None or m.source.startswith("hf://"),
        ),
    )


class GpuType(StrEnum):
    H100 = "H100"
    H200 = "H200"
    B200 = "B200"
    A100 = "A100"
    L4 = "L4"


MIG_PROFILE = r"^[1-7]g\.[0-9]{1,3}gb$"
"""A MIG profile's name: compute slices, then memory (`1g.10gb`)."""


def _cel_map(entries: dict[str, object]) -> str:
    """A CEL map literal of string keys; values are strings, ints or lists of strings."""

    def value(v: object) -> str:
        if isinstance(v, str):
            return cel_string(v)
        if isinstance(v, int):
            return str(v)
        return "[" + ", ".join(cel_string(str(item)) for item in v) + "]"  # type: ignore[attr-defined]

    return "{" + ", ".join(f"{cel_string(k)}: {value(v)}" for k, v in entries.items()) + "}"


_MIG_PROFILES_CEL = _cel_map({name: list(gpu.mig_profiles) for name, gpu in GPU_TYPES.items()})
_MIG_PROFILES_TEXT = "; ".join(
    f"{name}: {', '.join(gpu.mig_profiles) or 'no MIG'}" for name, gpu in GPU_TYPES.items()
)
_MIG_MEMORY_CEL = _cel_map(
    {p: mig_memory_gb(p) for gpu in GPU_TYPES.values() for p in gpu.mig_profiles}
)
_MAX_MEMORY_CEL = _cel_map(
    {name: max(p.memory_gb for p in gpu.products) for name, gpu in GPU_TYPES.items()}
)
_MAX_MEMORY_TEXT = ", ".join(
    f"{name} up to {max(p.memory_gb for p in gpu.products)}" for name, gpu in GPU_TYPES.items()
)


class GpuSpec(ApiModel):
    type: GpuType = GpuType.H100
    """GPU model every pod of the service runs on: pods may land on every product of its family
    (`nvidia.com/gpu.product` by GFD: H100 SXM, PCIe and NVL, …) that has `minMemoryGB`."""
    count: Annotated[int, Field(ge=1, le=8)] = 1
    """GPUs per pod (`nvidia.com/gpu` request and limit; 1 with `mig`)."""
    min_memory_gb: Annotated[int, Field(ge=1, le=1024)] | None = Field(
        default=None, alias="minMemoryGB"
    )
    """Memory per GPU the model needs, in GB as GPUs are sold (80 for an H100 80GB): products of
    the type with less are not selected (A100 40GB with 80). With `mig`, the slice's memory."""
    mig: Annotated[str, Field(pattern=MIG_PROFILE, max_length=16)] | None = None
    """A MIG profile of the type (`1g.10gb`): each pod gets one slice, requested as the resource
    `nvidia.com/mig-<profile>` (the device plugin's `mixed` strategy) instead of a whole GPU."""
    products: (
        Annotated[list[Annotated[str, Field(pattern=LABEL_VALUE, min_length=1, max_length=63)]],
                  Field(min_length=1, max_length=16)]
        | None
    ) = None  # fmt: skip
    """The node label values to select instead of the type's products, exactly as the nodes
    carry them (an override: `NVIDIA-A100-SXM4-40GB-MIG-1g.5gb` under the `single` MIG
    strategy, a product llmfleet does not know, a cloud provider's accelerator label)."""
    node_label: Annotated[str, Field(pattern=LABEL_KEY, max_length=316)] | None = None
    """The node label `products` are values of, where nodes carry no GFD labels (a cloud
    provider's, e.g. `cloud.google.com/gke-accelerator`); `nvidia.com/gpu.product` when unset."""

    rules = (
        Rule(
            cel=f"!has(self.mig) || self.mig in {_MIG_PROFILES_CEL}[self.type]",
            message="gpu.mig is not a MIG profile of gpu.type (H100 by default), so no node "
            f"offers that slice: choose one of the type's ({_MIG_PROFILES_TEXT})",
            field_path=".mig",
            check=lambda g: g.mig is None or g.mig in GPU_TYPES[g.type.value].mig_profiles,
        ),
        Rule(
            cel="!has(self.mig) || self.count == 1",
            message="gpu.mig gives each pod one MIG slice (a process uses one MIG device): "
            "set gpu.count to 1, or drop gpu.mig for whole GPUs",
            field_path=".count",
            check=lambda g: g.mig is None or g.count == 1,
        ),
        Rule(
            cel="!has(self.minMemoryGB) || has(self.products) || has(self.mig) || "
            f"self.minMemoryGB <= {_MAX_MEMORY_CEL}[self.type]",
            message="gpu.minMemoryGB is more than any product of gpu.type (H100 by default) "
            f"has per GPU ({_MAX_MEMORY_TEXT} GB), so no node fits: choose a larger GPU type, "
            "more GPUs per pod (gpu.count) with a lower minMemoryGB, or lower it",
            field_path=".minMemoryGB",
            check=lambda g: (
                g.min_memory_gb is None
                or g.products is not None
                or g.mig is not None
                or g.min_memory_gb <= max(p.memory_gb for p in GPU_TYPES[g.type.value].products)
            ),
        ),
        Rule(
            cel="!has(self.mig) || !has(self.minMemoryGB) || !(self.mig in "
            f"{_MIG_MEMORY_CEL}) || self.minMemoryGB <= {_MIG_MEMORY_CEL}[self.mig]",
            message="gpu.mig's slice has less memory than gpu.minMemoryGB (a profile's name "
            "ends in its memory: 3g.40gb has 40 GB): choose a larger profile",
            field_path=".minMemoryGB",
            check=lambda g: (
                g.mig is None
                or g.min_memory_gb is None
                or re.fullmatch(MIG_PROFILE, g.mig) is None
                or g.min_memory_gb <= mig_memory_gb(g.mig)
            ),
        ),
        Rule(
            cel="!has(self.nodeLabel) || has(self.products)",
            message="gpu.nodeLabel needs gpu.products, the values of that label to select "
            "(llmfleet knows only GFD's product names)",
            field_path=".products",
            reason="FieldValueRequired",
            check=lambda g: g.node_label is None or g.products is not None,
        ),
        Rule(
            cel="!has(self.products) || !has(self.minMemoryGB) || has(self.mig)",
            message="gpu.products names the nodes to select itself, so gpu.minMemoryGB would "
            "not be applied: give one of them",
            field_path=".minMemoryGB",
            check=lambda g: g.products is None or g.min_memory_gb is None or g.mig is not None,
        ),
        Rule(
            cel="!has(self.products) || self.products.all(p, self.products.exists_one(q, q == p))",
            message="gpu.products name each product once",
            field_path=".products",
            check=lambda g: g.products is None or len(set(g.products)) == len(g.products),
        ),
    )

    def node_label_key(self) -> str:
        """The node label the pods select by."""
        return self.node_label or GPU_PRODUCT_LABEL

    def node_products(self) -> tuple[str, ...]:
        """The values of `node_label_key()` a pod may land on: `products` when given, else every
        product of the type with `minMemoryGB` (all of them with `mig`: the slice is what must
        fit, and the resource selects the nodes that have it)."""
        if self.products is not None:
            return tuple(self.products)
        gpu = GPU_TYPES[self.type.value]
        return tuple(p.label for p in gpu.fitting(None if self.mig else self.min_memory_gb))

    def resource(self) -> str:
        """The extended resource a pod requests `count` of: a whole GPU or the MIG slice."""
        return GPU_RESOURCE if self.mig is None else mig_resource(self.mig)


class KvCacheDtype(StrEnum):
    AUTO = "auto"
    FP8 = "fp8"
    FP8_E4M3 = "fp8_e4m3"
    FP8_E5M2 = "fp8_e5m2"


class Quantization(StrEnum):
    FP8 = "fp8"
    AWQ = "awq"
    GPTQ = "gptq"
    COMPRESSED_TENSORS = "compressed-tensors"


class ChunkedPrefill(ApiModel):
    enabled: bool = True
    """Split long prompts into chunks batched with decodes (keeps ITL steady under long prompts)."""
    max_batched_tokens: Annotated[int, Field(ge=64, le=1_048_576)] | None = None
    """Token budget per engine step; the launcher sizes it from the SLO targets when unset.
    With chunked prefill off a step must hold a whole prompt: it must then be at least
    `model.maxModelLen`, which must be set (vLLM refuses to start otherwise)."""


class SpeculativeMethod(StrEnum):
    NGRAM = "ngram"
    EAGLE = "eagle"
    EAGLE3 = "eagle3"
    MTP = "mtp"
    DRAFT_MODEL = "draft_model"


class SpeculativeSpec(ApiModel):
    method: SpeculativeMethod
    """Speculative decoding method."""
    model: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    """Draft or EAGLE head model; required for `draft_model`, `eagle` and `eagle3`."""
    num_tokens: Annotated[int, Field(ge=1, le=16)] = 3
    """Tokens proposed per step."""

    rules = (
        Rule(
            cel="self.method != 'ngram' || !has(self.model)",
            message="speculative method ngram proposes tokens from the prompt itself and takes "
            "no model: remove speculative.model, or choose draft_model, eagle or eagle3",
            field_path=".model",
            check=lambda s: s.method != "ngram" or s.model is None,
        ),
        Rule(
            cel="!(self.method in ['draft_model', 'eagle', 'eagle3']) || has(self.model)",
            message="speculative method draft_model, eagle and eagle3 need a model",
            field_path=".model",
            reason="FieldValueRequired",
            check=lambda s: (
                s.method not in ("draft_model", "eagle", "eagle3") or s.model is not None
            ),
        ),
        Rule(
            cel="!has(self.model) || !self.model.contains('://')",
            message="speculative.model is a hub repository id (org/name) or a path in the "
            "image, not a URL: vLLM loads it as it is",
            field_path=".model",
            check=lambda s: s.model is None or "://" not in s.model,
        ),
    )


class EnvVar(ApiModel):
    name: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=256)]
    """Environment variable name."""
    value: Annotated[str, Field(max_length=32_768)] = ""
    """Its value (plain text, in this object and the Deployment: use `valueFrom` for a
    secret)."""
    value_from: EnvVarSource | None = None
    """Its value from a Secret's or a ConfigMap's key, read by the kubelet when the pod starts
    (a gated model's `HF_TOKEN`): it appears in no object llmfleet writes."""

    rules = (
        Rule(
            cel="!has(self.valueFrom) || !has(self.value) || self.value == ''",
            message="an env entry takes value or valueFrom, not both",
            field_path=".valueFrom",
            check=lambda v: v.value_from is None or v.value == "",
        ),
        Rule(
            cel="!(self.name in [" + ", ".join(cel_string(n) for n in L.OPERATOR_ENV) + "])",
            message="env " + " and ".join(L.OPERATOR_ENV) + " are set by the operator in every "
            "engine container: use another name",
            field_path=".name",
            check=lambda e: e.name not in L.OPERATOR_ENV,
        ),
        Rule(
            cel="!(self.name in [" + ", ".join(cel_string(n) for n in L.LAUNCHER_ENV) + "])",
            message="env " + " and ".join(L.LAUNCHER_ENV) + " are set by the runtime launcher "
            "for the engine (the KV-transfer side channel: the pod's own address): use another "
            "name",
            field_path=".name",
            check=lambda e: e.name not in L.LAUNCHER_ENV,
        ),
    )


class RuntimeSpec(ApiModel):
    image: Annotated[str, Field(min_length=1, max_length=512, pattern=IMAGE_REFERENCE)] | None = (
        None
    )
    """Runtime image (a reference the kubelet can pull: `registry:5000/org/name:tag@sha256:…`);
    llmfleet's tuned vLLM image of this release when unset."""
    engine: Annotated[str, Field(pattern="^vllm$")] = "vllm"
    """Inference engine; only `vllm` today."""
    gpu: GpuSpec = defaulted(GpuSpec)
    """GPU type and count per pod."""
    tensor_parallel: Annotated[int, Field(ge=1, le=8)] | None = None
    """Tensor-parallel size; defaults to the GPU count. Must divide it."""
    quantization: Quantization | None = None
    """Weight quantization method, when the checkpoint needs one named."""
    kv_cache_dtype: KvCacheDtype | None = None
    """KV-cache precision; the launcher picks fp8 on Hopper and newer when unset."""
    prefix_caching: bool = True
    """Reuse KV blocks of shared prompt prefixes."""
    chunked_prefill: ChunkedPrefill = defaulted(ChunkedPrefill)
    """Chunked prefill and its per-step token budget."""
    cuda_graphs: bool = True
    """Capture CUDA graphs (off means eager mode: slower, faster to start)."""
    speculative: SpeculativeSpec | None = None
    """Speculative decoding, off when unset."""
    max_num_seqs: Annotated[int, Field(ge=1, le=4096)] | None = None
    """Maximum concurrent sequences per engine."""
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] | None = None
    """Fraction of GPU memory the engine may use."""
    extra_args: Annotated[list[Annotated[str, Field(max_length=1024)]], Field(max_length=64)] = []
    """Extra `vllm serve` arguments; they win over the launcher's defaults."""
    env: Annotated[
        list[EnvVar],
        Field(
            max_length=64,
            # A map keyed by name, as a container's env is: the API server refuses a name given
            # twice, and server-side apply merges the list entry by entry.
            json_schema_extra={
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
            },
        ),
    ] = []
    """Extra environment variables for the engine container; each name once. They win over
    the operator's own defaults for the same name (HOME, HF_HOME, ...), except the ones the
    launcher is given by the operator (LLMFLEET_DRAIN_SECONDS, POD_IP, POD_NAME,
    POD_NAMESPACE)."""
    env_from: Annotated[list[EnvFromSource], Field(max_length=16)] | None = None
    """Every key of a Secret or ConfigMap as environment variables of the engine container."""
    image_pull_secrets: Annotated[list[LocalRef], Field(max_length=16)] | None = None
    """Secrets to pull `image` with (a private registry); the operator's own default ones
    (`LLMFLEET_OPERATOR_ENGINE_IMAGE_PULL_SECRETS`) when unset."""
    resources: ResourceOverrides | None = None
    """CPU and memory requests and limits of the engine container; derived from the GPU type
    and count when unset (docs/operations.md lists them)."""
    shm_size: Quantity | None = None
    """Size of the memory-backed /dev/shm (NCCL and vLLM's tensor-parallel workers exchange
    data through it); 2Gi per GPU when unset."""

    rules = (
        Rule(
            cel="!has(self.image) || !self.image.contains('@') || "
            f"self.image.matches({cel_string(DIGEST)})",
            message="runtime.image's digest must be sha256 with 64 lowercase hex digits (or "
            "sha384 with 96, sha512 with 128): the kubelet cannot pull by any other",
            field_path=".image",
            check=lambda r: (
                r.image is None or "@" not in r.image or re.search(DIGEST, r.image) is not None
            ),
        ),
        Rule(
            cel=f"!has(self.image) || {_image_name_length_cel()} <= {IMAGE_NAME_MAX}",
            message=f"runtime.image's name must be at most {IMAGE_NAME_MAX} characters as the "
            "kubelet reads it (registry and path, without tag and digest; docker.io/ and its "
            "library/ count for an image that names no registry): it cannot pull a longer one",
            field_path=".image",
            check=lambda r: r.image is None or image_name_length(r.image) <= IMAGE_NAME_MAX,
        ),
        Rule(
            cel=f"!has(self.image) || !self.image.matches({cel_string(IMAGE_ID)})",
            message="runtime.image may not be 64 hex digits alone: the kubelet reads them as an "
            "image ID, not a name it can pull (write the repository: name@sha256:<digits>)",
            field_path=".image",
            check=lambda r: r.image is None or re.search(IMAGE_ID, r.image) is None,
        ),
        Rule(
            cel="!has(self.imagePullSecrets) || "
            "self.imagePullSecrets.all(s, self.imagePullSecrets.exists_one(t, t.name == s.name))",
            message="runtime.imagePullSecrets name each Secret once",
            field_path=".imagePullSecrets",
            check=lambda r: (
                r.image_pull_secrets is None
                or len({s.name for s in r.image_pull_secrets}) == len(r.image_pull_secrets)
            ),
        ),
        Rule(
            cel="!has(self.envFrom) || self.envFrom.all(s, self.envFrom.exists_one(t, t == s))",
            message="runtime.envFrom names each source once (the same keys twice, the last "
            "winning)",
            field_path=".envFrom",
            check=lambda r: (
                r.env_from is None or all(r.env_from.count(source) == 1 for source in r.env_from)
            ),
        ),
        Rule(
            cel="!has(self.tensorParallel) || "
            "(self.tensorParallel <= self.gpu.count && self.gpu.count % self.tensorParallel == 0)",
            message="tensorParallel must divide gpu.count (each pod has gpu.count GPUs, 1 by "
            "default): set runtime.gpu.count",
            field_path=".tensorParallel",
            check=lambda r: (
                r.tensor_parallel is None
                or (r.tensor_parallel <= r.gpu.count and r.gpu.count % r.tensor_parallel == 0)
            ),
        ),
        Rule(
            cel="!has(self.maxNumSeqs) || !has(self.chunkedPrefill) || "
            "!has(self.chunkedPrefill.maxBatchedTokens) || "
            "self.chunkedPrefill.maxBatchedTokens >= self.maxNumSeqs",
            message="chunkedPrefill.maxBatchedTokens must be at least maxNumSeqs: every running "
            "sequence decodes a token in each step (vLLM refuses to start otherwise)",
            field_path=".chunkedPrefill.maxBatchedTokens",
            check=lambda r: (
                r.max_num_seqs is None
                or r.chunked_prefill.max_batched_tokens is None
                or r.chunked_prefill.max_batched_tokens >= r.max_num_seqs
            ),
        ),
        Rule(
            cel="self.env.map(e, has(e.value) ? size(e.value) : 0).sum() + "
            "self.extraArgs.map(a, size(a)).sum() "
            f"<= {RENDERED_TEXT_MAX}",
            message=f"env values and extraArgs hold at most {RENDERED_TEXT_MAX} characters "
            "together: the operator copies them into every pool's runtime config, a ConfigMap "
            "the API server stores only up to 1 MiB",
            field_path=".env",
            check=lambda r: (
                sum(len(e.value or "") for e in r.env) + sum(len(a) for a in r.extra_args)
                <= RENDERED_TEXT_MAX
            ),
        ),
    )

    @field_validator("env")
    @classmethod
    def _env_names_unique(cls, env: list[EnvVar]) -> list[EnvVar]:
        """The schema's list-map refuses duplicates on the API server; this is its Python twin."""
        names = [var.name for var in env]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"env names must be unique: {', '.join(twice)} given more than once")
        return env


class Toleration(ApiModel):
    key: Annotated[str, Field(pattern=LABEL_KEY, max_length=316)] | None = None
    """Taint key the toleration matches; unset with operator Exists matches every taint."""
    operator: Annotated[str, Field(pattern="^(Exists|Equal)$")] = "Equal"
    """`Exists` (any value, so no `value`) or `Equal`."""
    value: LabelValue | None = None
    """Taint value to match with `Equal`."""
    effect: Annotated[str, Field(pattern="^(NoSchedule|PreferNoSchedule|NoExecute)$")] | None = None
    """Taint effect to match; all effects when unset."""
    toleration_seconds: Annotated[int, Field(ge=0, le=MAX_EXACT_INTEGER)] | None = None
    """For effect NoExecute only: how long the pod stays bound after the taint appears."""

    # Kubernetes' own rules for a pod's tolerations: the Deployment is refused without them.
    rules = (
        Rule(
            cel="self.operator != 'Exists' || !has(self.value) || self.value == ''",
            message="a toleration with operator Exists matches every value: remove value, or "
            "use operator Equal",
            field_path=".value",
            check=lambda t: t.operator != "Exists" or not t.value,
        ),
        Rule(
            cel="self.operator == 'Exists' || (has(self.key) && self.key != '')",
            message="a toleration without key matches every taint and needs operator Exists",
            field_path=".operator",
            check=lambda t: t.operator == "Exists" or bool(t.key),
        ),
        Rule(
            cel="!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            message="tolerationSeconds needs effect NoExecute (only NoExecute taints evict)",
            field_path=".tolerationSeconds",
            check=lambda t: t.toleration_seconds is None or t.effect == "NoExecute",
        ),
    )


def _no_default(schema: dict[str, object]) -> None:
    schema.pop("default", None)


class PoolSpec(ApiModel):
    replicas: Annotated[int, Field(ge=0, le=1000, json_schema_extra=_no_default)] = 1
    """Serving replicas when the autoscaler is off, and its starting point when on. Unset: 1,
    or `minReplicas` when that is higher (a default never contradicts a bound)."""
    min_replicas: Annotated[int, Field(ge=0, le=1000)] | None = None
    """Lowest replica count the autoscaler may choose. Unset, the autoscaler keeps 2 serving
    until the pool's load is measured light (nothing needed 2 for 30 minutes, nor for twice the
    longest lull between two such needs), then 1."""
    max_replicas: Annotated[int, Field(ge=1, le=1000)] | None = None
    """Highest replica count the autoscaler may choose."""
    node_selector: Annotated[dict[str, LabelValue], Field(max_length=32)] = {}
    """Extra node labels the pool's pods require (the GPU product label is added for you; one
    given here must name the product of `runtime.gpu.type`)."""
    tolerations: Annotated[list[Toleration], Field(max_length=32)] = []
    """Extra tolerations (the `nvidia.com/gpu` one is added for you)."""

    @model_validator(mode="before")
    @classmethod
    def _replicas_follow_min_replicas(cls, data: object) -> object:
        """An unset `replicas` is 1, or `minReplicas` when that is higher. The CRD has no default
        for it, so the API server's rules see it unset, as here."""
        if isinstance(data, dict) and "replicas" not in data:
            low = data.get("minReplicas", data.get("min_replicas"))
            if isinstance(low, int) and not isinstance(low, bool) and low > 1:
                return {**data, "replicas": low}
        return data

    rules = (
        Rule(
            cel=f"self.nodeSelector.all(k, k.matches({cel_string(QUALIFIED_KEY)}) && "
            "(!k.contains('/') || k.indexOf('/') <= 253))",
            message="nodeSelector keys are label keys: an optional DNS subdomain (at most 253 "
            "characters) and '/', then a name of at most 63 (letters, digits, '-', '_', '.'; a "
            "letter or digit at each end)",
            field_path=".nodeSelector",
            check=lambda p: all(
                re.match(QUALIFIED_KEY, key) and ("/" not in key or key.index("/") <= 253)
                for key in p.node_selector
            ),
        ),
        Rule(
            cel="!has(self.minReplicas) || !has(self.maxReplicas) || "
            "self.minReplicas <= self.maxReplicas",
            message="minReplicas must not exceed maxReplicas",
            field_path=".minReplicas",
            check=lambda p: (
                p.min_replicas is None or p.max_replicas is None or p.min_replicas <= p.max_replicas
            ),
        ),
        Rule(
            cel="!has(self.minReplicas) || !has(self.replicas) || "
            "self.minReplicas <= self.replicas",
            message="minReplicas must not exceed replicas",
            field_path=".minReplicas",
            check=lambda p: p.min_replicas is None or p.min_replicas <= p.replicas,
        ),
        Rule(
            cel="!has(self.maxReplicas) || !has(self.replicas) || "
            "self.replicas <= self.maxReplicas",
            message="replicas must not exceed maxReplicas",
            field_path=".replicas",
            check=lambda p: p.max_replicas is None or p.replicas <= p.max_replicas,
        ),
    )


class Mode(StrEnum):
    UNIFIED = "Unified"
    DISAGGREGATED = "Disaggregated"


class KvConnector(StrEnum):
    NIXL = "NixlConnector"
    LMCACHE = "LMCacheConnectorV1"


class KvTransfer(ApiModel):
    connector: KvConnector = KvConnector.NIXL
    """How prefill pods hand KV caches to decode pods."""


class TopologySpec(ApiModel):
    mode: Mode = Mode.UNIFIED
    """`Unified` (one pool does prefill and decode) or `Disaggregated` (one pool each)."""
    unified: PoolSpec | None = None
    """The pool of a Unified service (one replica when unset)."""
    prefill: PoolSpec | None = None
    """Prefill pool of a Disaggregated service."""
    decode: PoolSpec | None = None
    """Decode pool of a Disaggregated service."""
    kv_transfer: KvTransfer | None = None
    """KV-cache transfer between prefill and decode; required when Disaggregated."""

    rules = (
        Rule(
            cel="self.mode != 'Disaggregated' || (has(self.prefill) && has(self.decode))",
            message="mode Disaggregated needs both a prefill and a decode pool",
            field_path=".mode",
            reason="FieldValueRequired",
            check=lambda t: (
                t.mode != Mode.DISAGGREGATED or (t.prefill is not None and t.decode is not None)
            ),
        ),
        Rule(
            cel="self.mode != 'Disaggregated' || has(self.kvTransfer)",
            message="mode Disaggregated needs kvTransfer.connector "
            "(NixlConnector or LMCacheConnectorV1)",
            field_path=".kvTransfer",
            reason="FieldValueRequired",
            check=lambda t: t.mode != Mode.DISAGGREGATED or t.kv_transfer is not None,
        ),
        Rule(
            cel="self.mode != 'Unified' || "
            "(!has(self.prefill) && !has(self.decode) && !has(self.kvTransfer))",
            message="mode Unified takes only the unified pool: remove prefill, decode and "
            "kvTransfer, or set mode Disaggregated",
            field_path=".mode",
            check=lambda t: (
                t.mode != Mode.UNIFIED
                or (t.prefill is None and t.decode is None and t.kv_transfer is None)
            ),
        ),
        Rule(
            cel="self.mode != 'Disaggregated' || !has(self.unified)",
            message="mode Disaggregated has no unified pool: use prefill and decode",
            field_path=".unified",
            check=lambda t: t.mode != Mode.DISAGGREGATED or t.unified is None,
        ),
    )


class SloSpec(ApiModel):
    ttft_p95_ms: Annotated[float, Field(gt=0, le=600_000)] | None = None
    """Target 95th-percentile time to first token, in milliseconds."""
    itl_p95_ms: Annotated[float, Field(gt=0, le=60_000)] | None = None
    """Target 95th-percentile inter-token latency, in milliseconds."""
    max_kv_cache_usage: Annotated[float, Field(gt=0, le=1)] = 0.85
    """KV-cache usage (0 to 1) above which a pool counts as saturated."""


class AutoscalingSpec(ApiModel):
    enabled: bool = False
    """Let llmfleet's autoscaler size the pools (within min/max replicas)."""
    warm_spares: Annotated[int, Field(ge=0, le=100)] = 0
    """Loaded, warm pods per pool kept out of traffic, promoted in seconds on scale-up."""
    gpu_budget: Annotated[int, Field(ge=1, le=100_000)] | None = None
    """Most GPUs the whole service may hold, spares included. Admission refuses a budget below
    the spec's replicas (`runtime.gpu.count` x the sum of every pool's `replicas`) or below its
    minimum footprint (`runtime.gpu.count` x the sum of every pool's least replicas: with
    autoscaling on `minReplicas`, 1 when unset; with it off `replicas`). Warm spares are not part
    of either: they are trimmed first to keep the budget."""
    scale_down_stabilization_seconds: Annotated[int, Field(ge=0, le=86_400)] = 300
    """How long load must stay low before a pool shrinks."""

    rules = (
        Rule(
            cel="self.enabled || self.scaleDownStabilizationSeconds == 300",
            message="autoscaling.scaleDownStabilizationSeconds acts only with autoscaling.enabled "
            "true, and it is false (its default): set enabled: true, or remove "
            "scaleDownStabilizationSeconds",
            field_path=".scaleDownStabilizationSeconds",
            check=lambda a: a.enabled or a.scale_down_stabilization_seconds == 300,
            ratchets=True,
        ),
    )
