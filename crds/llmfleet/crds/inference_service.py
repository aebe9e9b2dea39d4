"""The `InferenceService` resource (llmfleet.dev/v1alpha1, short name `llmsvc`): spec and status.

The operator owns `status` except `status.autoscaling`, which only the autoscaler writes; no
controller ever writes `spec` (GitOps owns it).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from enum import StrEnum
from typing import Annotated, Any

from pydantic import Field

from llmfleet.crds import engine_args, engine_args_cel
from llmfleet.crds import labels as L
from llmfleet.crds._base import ApiModel, Rule, cel_string, defaulted
from llmfleet.crds.gpus import (
    GPU_COUNT_LABEL,
    GPU_FAMILY_LABEL,
    GPU_MEMORY_LABEL,
    GPU_PRESENT_LABEL,
    GPU_PRODUCT_LABEL,
    GPU_TYPES,
    MIG_CAPABLE_LABEL,
    MIG_STRATEGY_LABEL,
)
from llmfleet.crds.policy import RolloutSpec, TrafficSpec
from llmfleet.crds.spec import (
    AutoscalingSpec,
    Mode,
    ModelSpec,
    PoolSpec,
    RuntimeSpec,
    SloSpec,
    TopologySpec,
)

GROUP = "llmfleet.dev"
VERSION = "v1alpha1"
KIND = "InferenceService"
PLURAL = "inferenceservices"
SINGULAR = "inferenceservice"
SHORT_NAMES = ("llmsvc",)
API_VERSION = f"{GROUP}/{VERSION}"


def _pool_cel(pool: str) -> str:
    return f"self.topology.{pool}"


def _pools_sum_cel(term: Callable[[str], str]) -> str:
    """CEL: `term(pool)` summed over the pools the spec runs (a Unified service without a
    unified pool runs the default one: 1 replica, no minReplicas, so the term is 1)."""
    prefill, decode = (
        f"(has({_pool_cel(p)}) ? {term(_pool_cel(p))} : 0)" for p in ("prefill", "decode")
    )
    unified = _pool_cel("unified")
    return (
        f"(self.topology.mode == 'Disaggregated' ? {prefill} + {decode} : "
        f"(has({unified}) ? {term(unified)} : 1))"
    )


def _replicas_cel(pool: str) -> str:
    """CEL: a pool's replicas, unset being 1 or minReplicas when that is higher (`PoolSpec`)."""
    return (
        f"(has({pool}.replicas) ? {pool}.replicas : "
        f"(has({pool}.minReplicas) && {pool}.minReplicas > 1 ? {pool}.minReplicas : 1))"
    )


def _min_replicas_cel(pool: str) -> str:
    return f"(has({pool}.minReplicas) ? {pool}.minReplicas : 1)"


_GPU_PRODUCTS_CEL = (
    "{" + ", ".join(
        f"'{n}': [" + ", ".join(f"'{p.label}'" for p in g.products) + "]"
        for n, g in GPU_TYPES.items()
    ) + "}"
)  # fmt: skip
_PRODUCT_MEMORY_CEL = (
    "{" + ", ".join(f"'{p.label}': {p.memory_gb}" for g in GPU_TYPES.values() for p in g.products)
    + "}"
)  # fmt: skip
_GPU_PRODUCTS_TEXT = "; ".join(
    f"{n}: {', '.join(p.label for p in g.products)}" for n, g in GPU_TYPES.items()
)


def _product_rule(pool: str) -> Rule:
    """A pool's nodeSelector may name the GPU product only as one `runtime.gpu` selects."""
    selector = f"{_pool_cel(pool)}.nodeSelector"
    named = f"{selector}['{GPU_PRODUCT_LABEL}']"
    gpu = "self.runtime.gpu"
    return Rule(
        cel=f"!has({_pool_cel(pool)}) || !has({selector}) || "
        f"!('{GPU_PRODUCT_LABEL}' in {selector}) || has({gpu}.nodeLabel) || "
        f"(has({gpu}.products) ? {named} in {gpu}.products : "
        f"({named} in {_GPU_PRODUCTS_CEL}[{gpu}.type] && (!has({gpu}.minMemoryGB) || "
        f"has({gpu}.mig) || {_PRODUCT_MEMORY_CEL}[{named}] >= {gpu}.minMemoryGB)))",
        message=f"topology.{pool}.nodeSelector's {GPU_PRODUCT_LABEL} is not a product "
        "runtime.gpu selects (runtime.gpu.products if given, else the products of "
        f"runtime.gpu.type, H100 by default, with runtime.gpu.minMemoryGB: {_GPU_PRODUCTS_TEXT})"
        ": no node has both. Remove it (llmfleet selects runtime.gpu's products itself) or "
        "change runtime.gpu",
        field_path=f".topology.{pool}.nodeSelector",
        check=lambda s: s.pool_product_matches(pool),
    )


def _node_label_rule(pool: str) -> Rule:
    """A pool's nodeSelector may name `gpu.nodeLabel` only with a value of `gpu.products`: the
    pods' affinity requires one of those, so no node has another as well."""
    selector = f"{_pool_cel(pool)}.nodeSelector"
    gpu = "self.runtime.gpu"
    return Rule(
        cel=f"!has({_pool_cel(pool)}) || !has({selector}) || !has({gpu}.nodeLabel) || "
        f"!has({gpu}.products) || !({gpu}.nodeLabel in {selector}) || "
        f"{selector}[{gpu}.nodeLabel] in {gpu}.products",
        message=f"topology.{pool}.nodeSelector gives runtime.gpu.nodeLabel a value that is not "
        "in runtime.gpu.products: the pods require one of those, so no node has both. Remove "
        "it from nodeSelector (llmfleet selects the products itself)",
        field_path=f".topology.{pool}.nodeSelector",
        check=lambda s: s.pool_node_label_matches(pool),
    )


@functools.lru_cache(maxsize=256)
def _extra_args_problems(
    words: tuple[str, ...], fields: engine_args.TypedFields
) -> tuple[str, ...]:
    """`engine_args.problems`, kept for the last inputs: each of a spec's extraArgs rules (one
    per `engine_args_cel.rules()`, ~35) asks for the same list, and making it anew for each
    was 85% of a spec's validation (bench/spec_validation.py)."""
    return tuple(engine_args.problems(list(words), fields))


def _args_rule(rule: engine_args_cel.ArgsRule) -> Rule:
    """An extraArgs check of the launcher as an admission rule: its Python twin is the
    launcher's own check (`engine_args.problems`)."""
    return Rule(
        cel=rule.cel,
        message=rule.message,
        field_path=".runtime.extraArgs",
        check=lambda s: not any(rule.refuses(p) for p in s.extra_args_problems()),
    )


_GPU_MEMORY_CEL = (
    "{" + ", ".join(
        f"'{n}': [" + ", ".join(sorted({f"'{p.memory_mib}'" for p in g.products})) + "]"
        for n, g in GPU_TYPES.items()
    ) + "}"
)  # fmt: skip
_GPU_MEMORY_TEXT = "; ".join(
    f"{n}: {', '.join(sorted({str(p.memory_mib) for p in g.products}))}"
    for n, g in GPU_TYPES.items()
)
_GPU_FAMILIES_CEL = "{" + ", ".join(f"'{n}': '{g.family}'" for n, g in GPU_TYPES.items()) + "}"


def _fits_rule(pool: str) -> Rule:
    """A pool's nodeSelector may not ask for GPU nodes no pod of the spec fits on."""
    selector = f"{_pool_cel(pool)}.nodeSelector"
    labels = (GPU_COUNT_LABEL, GPU_FAMILY_LABEL, GPU_PRESENT_LABEL, GPU_MEMORY_LABEL,
              MIG_STRATEGY_LABEL, MIG_CAPABLE_LABEL)  # fmt: skip
    count, family, present, memory, strategy, capable = (
        f"{selector}[{cel_string(label)}]" for label in labels
    )
    return Rule(
        cel=f"!has({_pool_cel(pool)}) || !has({selector}) || ("
        f"(!({cel_string(GPU_COUNT_LABEL)} in {selector}) || ({count}.matches('^[0-9]{{1,9}}$') "
        f"&& int({count}) >= self.runtime.gpu.count)) && "
        f"(!({cel_string(GPU_FAMILY_LABEL)} in {selector}) || "
        f"{family} == {_GPU_FAMILIES_CEL}[self.runtime.gpu.type]) && "
        f"(!({cel_string(GPU_PRESENT_LABEL)} in {selector}) || {present} == 'true') && "
        f"(!({cel_string(GPU_MEMORY_LABEL)} in {selector}) || has(self.runtime.gpu.products) || "
        f"{memory} in {_GPU_MEMORY_CEL}[self.runtime.gpu.type]) && "
        f"(!has(self.runtime.gpu.mig) || ((!({cel_string(MIG_STRATEGY_LABEL)} in {selector}) || "
        f"{strategy} == 'mixed') && (!({cel_string(MIG_CAPABLE_LABEL)} in {selector}) || "
        f"{capable} == 'true'))))",
        message=f"topology.{pool}.nodeSelector asks for nodes no pod of this spec fits on: "
        f"{GPU_COUNT_LABEL} below runtime.gpu.count (or not a number), {GPU_FAMILY_LABEL} "
        "other than runtime.gpu.type's (H100 by default: set runtime.gpu.type), "
        f'{GPU_PRESENT_LABEL} other than "true", {GPU_MEMORY_LABEL} (MiB) that no product '
        f"of runtime.gpu.type has ({_GPU_MEMORY_TEXT}), or, with runtime.gpu.mig (a slice "
        f"resource of the mixed strategy), {MIG_STRATEGY_LABEL} other than mixed or "
        f'{MIG_CAPABLE_LABEL} other than "true"',
        field_path=f".topology.{pool}.nodeSelector",
        check=lambda s: s.pool_fits(pool),
    )


class InferenceServiceSpec(ApiModel):
    model: ModelSpec
    """The model to serve."""
    runtime: RuntimeSpec = defaulted(RuntimeSpec)
    """Engine, GPU and tuning; unset knobs get per-GPU defaults from the launcher."""
    topology: TopologySpec = defaulted(TopologySpec)
    """Unified or disaggregated pools and their replica counts."""
    slo: SloSpec = defaulted(SloSpec)
    """Latency and KV-pressure targets the autoscaler and canary analysis hold the service to."""
    autoscaling: AutoscalingSpec = defaulted(AutoscalingSpec)
    """Autoscaling and warm spares."""
    traffic: TrafficSpec = Field(default_factory=TrafficSpec)
    """Gateway traffic policies."""
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    """How spec changes roll out."""

    rules = (
        Rule(
            cel="!has(self.autoscaling.gpuBudget) || self.runtime.gpu.count * "
            f"{_pools_sum_cel(_replicas_cel)} <= self.autoscaling.gpuBudget",
            message="autoscaling.gpuBudget is below what the replicas need: runtime.gpu.count x "
            "the replicas of every pool (warm spares come on top only as the budget allows)",
            field_path=".autoscaling.gpuBudget",
            check=lambda s: (
                s.autoscaling.gpu_budget is None or s.replica_gpus() <= s.autoscaling.gpu_budget
            ),
        ),
        Rule(
            # With autoscaling off the least replicas are the replicas: the rule above.
            cel="!has(self.autoscaling.gpuBudget) || !self.autoscaling.enabled || "
            f"self.runtime.gpu.count * {_pools_sum_cel(_min_replicas_cel)} "
            "<= self.autoscaling.gpuBudget",
            message="autoscaling.gpuBudget is below the minimum footprint the autoscaler must "
            "keep: runtime.gpu.count x every pool's minReplicas (1 when unset)",
            field_path=".autoscaling.gpuBudget",
            check=lambda s: (
                s.autoscaling.gpu_budget is None
                or not s.autoscaling.enabled
                or s.minimum_gpus() <= s.autoscaling.gpu_budget
            ),
        ),
        Rule(
            cel="!has(self.runtime.chunkedPrefill) || self.runtime.chunkedPrefill.enabled || "
            "!has(self.runtime.chunkedPrefill.maxBatchedTokens) || has(self.model.maxModelLen)",
            message="with chunked prefill off, runtime.chunkedPrefill.maxBatchedTokens needs "
            "model.maxModelLen: a step must then hold a whole prompt, so the budget must be "
            "checked against the context length",
            field_path=".model.maxModelLen",
            reason="FieldValueRequired",
            check=lambda s: (
                s.runtime.chunked_prefill.enabled
                or s.runtime.chunked_prefill.max_batched_tokens is None
                or s.model.max_model_len is not None
            ),
        ),
        Rule(
            cel="!has(self.runtime.chunkedPrefill) || self.runtime.chunkedPrefill.enabled || "
            "!has(self.runtime.chunkedPrefill.maxBatchedTokens) || !has(self.model.maxModelLen) "
            "|| self.runtime.chunkedPrefill.maxBatchedTokens >= self.model.maxModelLen",
            message="with chunked prefill off, runtime.chunkedPrefill.maxBatchedTokens must be "
            "at least model.maxModelLen (a step must hold a whole prompt; vLLM refuses to "
            "start otherwise)",
            field_path=".runtime.chunkedPrefill.maxBatchedTokens",
            check=lambda s: (
                s.runtime.chunked_prefill.enabled
                or s.runtime.chunked_prefill.max_batched_tokens is None
                or s.model.max_model_len is None
                or s.runtime.chunked_prefill.max_batched_tokens >= s.model.max_model_len
            ),
        ),
        Rule(
            cel="!has(self.autoscaling.gpuBudget) || "
            "self.autoscaling.gpuBudget >= self.runtime.gpu.count",
            message="autoscaling.gpuBudget is below one pod's GPUs (runtime.gpu.count, 1 by "
            "default): no pod of the service could ever run",
            field_path=".autoscaling.gpuBudget",
            check=lambda s: (
                s.autoscaling.gpu_budget is None or s.autoscaling.gpu_budget >= s.runtime.gpu.count
            ),
        ),
        *(_product_rule(pool) for pool in L.POOLS),
        *(_node_label_rule(pool) for pool in L.POOLS),
        *(_fits_rule(pool) for pool in L.POOLS),
        Rule(
            cel="!has(self.runtime.speculative) || !has(self.runtime.speculative.model) || "
            "self.runtime.speculative.model != self.model.name",
            message="runtime.speculative.model is model.name itself: a draft model (or EAGLE "
            "head) proposes tokens for a larger model, and the model as its own draft only "
            "doubles the memory",
            field_path=".runtime.speculative.model",
            check=lambda s: (
                s.runtime.speculative is None or s.runtime.speculative.model != s.model.name
            ),
        ),
        Rule(
            cel="!has(self.traffic) || !has(self.traffic.limits) || "
            "!has(self.traffic.limits.timeoutSeconds) || !has(self.rollout) || "
            "!has(self.rollout.analysis) || !has(self.rollout.analysis.maxTtftP95Ms) || "
            "self.rollout.analysis.maxTtftP95Ms < self.traffic.limits.timeoutSeconds * 1000.0",
            message="rollout.analysis.maxTtftP95Ms must be below traffic.limits.timeoutSeconds: "
            "a request times out before its first token could exceed the limit, so the limit "
            "never fails a canary",
            field_path=".rollout.analysis.maxTtftP95Ms",
            check=lambda s: (
                s.traffic.limits.timeout_seconds is None
                or s.rollout.analysis.max_ttft_p95_ms is None
                or s.rollout.analysis.max_ttft_p95_ms < s.traffic.limits.timeout_seconds * 1000
            ),
        ),
        Rule(
            cel="!has(self.traffic) || !has(self.traffic.limits) || "
            "!has(self.traffic.limits.maxTokens) || !has(self.model.maxModelLen) || "
            "self.traffic.limits.maxTokens < self.model.maxModelLen",
            message="traffic.limits.maxTokens must be below model.maxModelLen: prompt and "
            "output share the context, so a cap at or beyond it fails every request it lowers",
            field_path=".traffic.limits.maxTokens",
            check=lambda s: (
                s.traffic.limits.max_tokens is None
                or s.model.max_model_len is None
                or s.traffic.limits.max_tokens < s.model.max_model_len
            ),
        ),
        Rule(
            cel="!has(self.traffic) || !has(self.traffic.limits) || "
            "!has(self.traffic.limits.maxTokens) || "
            + engine_args_cel.first_values("--max-model-len")
            + f".all(v, !v.matches({cel_string(engine_args.INTEGER)}) || "
            "self.traffic.limits.maxTokens < int(v))",
            message="traffic.limits.maxTokens must be below the context runtime.extraArgs "
            "--max-model-len gives: prompt and output share it, so a cap at or beyond it fails "
            "every request it lowers",
            field_path=".traffic.limits.maxTokens",
            check=lambda s: (
                s.traffic.limits.max_tokens is None
                or all(
                    s.traffic.limits.max_tokens < int(v)
                    for v in engine_args.first_values(list(s.runtime.extra_args), "--max-model-len")
                    if re.match(engine_args.INTEGER, v)
                )
            ),
        ),
        Rule(
            cel="!has(self.traffic) || !has(self.traffic.limits) || "
            "!has(self.traffic.limits.timeoutSeconds) || !has(self.slo.ttftP95Ms) || "
            "self.traffic.limits.timeoutSeconds * 1000.0 > self.slo.ttftP95Ms",
            message="traffic.limits.timeoutSeconds must be longer than slo.ttftP95Ms: requests "
            "would time out before the first token the target allows",
            field_path=".traffic.limits.timeoutSeconds",
            check=lambda s: (
                s.traffic.limits.timeout_seconds is None
                or s.slo.ttft_p95_ms is None
                or s.traffic.limits.timeout_seconds * 1000 > s.slo.ttft_p95_ms
            ),
        ),
        *(_args_rule(rule) for rule in engine_args_cel.rules()),
    )

    def typed_fields(self) -> engine_args.TypedFields:
        """What the spec's typed fields set on the engine's command line (as the launcher reads
        the runtime config the operator renders from this spec)."""
        rt, model = self.runtime, self.model
        return engine_args.TypedFields(
            max_model_len=model.max_model_len,
            revision=model.revision,
            tensor_parallel=rt.tensor_parallel,
            quantization=None if rt.quantization is None else rt.quantization.value,
            kv_cache_dtype=None if rt.kv_cache_dtype is None else rt.kv_cache_dtype.value,
            prefix_caching=rt.prefix_caching,
            chunked_prefill=rt.chunked_prefill.enabled,
            max_batched_tokens=rt.chunked_prefill.max_batched_tokens,
            max_num_seqs=rt.max_num_seqs,
            gpu_memory_utilization=rt.gpu_memory_utilization,
            cuda_graphs=rt.cuda_graphs,
            speculative=rt.speculative is not None,
            kv_transfer=self.topology.mode == Mode.DISAGGREGATED,
            gpu_count=rt.gpu.count,
            streamed_source=(model.source or "").startswith(("s3://", "gs://")),
        )

    def extra_args_problems(self) -> list[str]:
        """What the launcher would refuse in `runtime.extraArgs` ([]: nothing)."""
        return list(_extra_args_problems(tuple(self.runtime.extra_args), self.typed_fields()))

    def pools(self) -> dict[str, PoolSpec]:
        """Pool name -> spec, in serving order; a Unified service without one gets the default."""
        topology = self.topology
        if topology.mode == Mode.DISAGGREGATED:
            assert topology.prefill is not None
            assert topology.decode is not None
            return {"prefill": topology.prefill, "decode": topology.decode}
        return {"unified": topology.unified or PoolSpec()}

    @property
    def served_name(self) -> str:
        return self.model.served_name or self.model.name

    def replica_gpus(self) -> int:
        """GPUs the spec's replicas hold (`replicas` of every pool; warm spares not counted)."""
        return self.runtime.gpu.count * sum(pool.replicas for pool in self.pools().values())

    def minimum_gpus(self) -> int:
        """The fewest GPUs the spec lets the service run on, its minimum footprint: every pool's
        least replicas (with autoscaling on `minReplicas`, 1 when unset: the budget may trim the
        autoscaler's own floor of 2 to that; with it off `replicas`), warm spares not counted
        (the budget trims them first)."""
        autoscaled = self.autoscaling.enabled
        least = [
            (1 if pool.min_replicas is None else pool.min_replicas) if autoscaled else pool.replicas
            for pool in self.pools().values()
        ]
        return self.runtime.gpu.count * sum(least)

    def pool_node_label_matches(self, pool: str) -> bool:
        """True unless `topology.<pool>.nodeSelector` gives `gpu.nodeLabel` a value outside
        `gpu.products`."""
        spec: PoolSpec | None = getattr(self.topology, pool)
        gpu = self.runtime.gpu
        if spec is None or gpu.node_label is None or gpu.products is None:
            return True
        named = spec.node_selector.get(gpu.node_label)
        return named is None or named in gpu.products

    def pool_fits(self, pool: str) -> bool:
        """False when `topology.<pool>.nodeSelector` asks for GPU nodes no pod of the spec fits
        on (too few GPUs, another family, none present)."""
        spec: PoolSpec | None = getattr(self.topology, pool)
        selector = spec.node_selector if spec is not None else {}
        count = selector.get(GPU_COUNT_LABEL)
        family = selector.get(GPU_FAMILY_LABEL)
        present = selector.get(GPU_PRESENT_LABEL)
        memory = selector.get(GPU_MEMORY_LABEL)
        gpu = self.runtime.gpu
        memories = {str(p.memory_mib) for p in GPU_TYPES[gpu.type.value].products}
        return (
            (count is None or (re.fullmatch("[0-9]{1,9}", count) is not None
                               and int(count) >= gpu.count))
            and (family is None or family == GPU_TYPES[gpu.type.value].family)
            and (present is None or present == "true")
            and (memory is None or gpu.products is not None or memory in memories)
            and (gpu.mig is None or (selector.get(MIG_STRATEGY_LABEL, "mixed") == "mixed"
                                     and selector.get(MIG_CAPABLE_LABEL, "true") == "true"))
        )  # fmt: skip

    def pool_product_matches(self, pool: str) -> bool:
        """True unless `topology.<pool>.nodeSelector` names a GPU product `runtime.gpu` does
        not select (or the pool is not given); not checked with `gpu.nodeLabel`."""
        spec: PoolSpec | None = getattr(self.topology, pool)
        named = spec.node_selector.get(GPU_PRODUCT_LABEL) if spec is not None else None
        gpu = self.runtime.gpu
        return named is None or gpu.node_label is not None or named in gpu.node_products()


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(ApiModel):
    type: Annotated[str, Field(max_length=64)]
    """Ready, Progressing, Degraded, ScalingLimited or CanaryInProgress."""
    status: ConditionStatus
    """True, False or Unknown."""
    reason: Annotated[str, Field(max_length=128)] = ""
    """CamelCase reason, e.g. InsufficientGPU."""
    message: Annotated[str, Field(max_length=4096)] = ""
    """What happened and what to do about it."""
    last_transition_time: str | None = None
    """When status last changed (RFC 3339)."""
    observed_generation: int | None = None
    """The spec generation this condition describes."""


class PoolStatus(ApiModel):
    replicas: int = 0
    """Pods of the pool (serving and spare)."""
    ready_replicas: int = 0
    """Pods that are Ready."""
    serving_replicas: int = 0
    """Ready pods that receive traffic."""
    spare_replicas: int = 0
    """Pods kept warm out of traffic."""


class CanaryPhase(StrEnum):
    PROGRESSING = "Progressing"
    PAUSED = "Paused"
    PROMOTING = "Promoting"
    PROMOTED = "Promoted"
    ROLLED_BACK = "RolledBack"


class CanaryStatus(ApiModel):
    phase: Annotated[str, Field(max_length=32)] = ""
    """Progressing, Paused, Promoting (the canary takes over), Promoted or RolledBack."""
    weight: int = 0
    """Percent of traffic the canary gets now (the gateway splits by it)."""
    step: int = 0
    """Index of the current step."""
    last_analysis: Annotated[str, Field(max_length=4096)] = ""
    """Result of the latest analysis, with the figures of canary and stable."""
    revision: Annotated[str, Field(max_length=64)] = ""
    """The canary's revision (what the spec asks for)."""
    stable_revision: Annotated[str, Field(max_length=64)] = ""
    """The stable revision the canary is compared with (`status.revision`)."""
    step_started_at: str | None = None
    """When the current step's weight started to be served (RFC 3339); unset while the canary's
    pods for it are starting."""
    last_analysis_time: str | None = None
    """When the latest analysis ran (RFC 3339)."""
    verdict: Annotated[str, Field(max_length=32)] = ""
    """The latest analysis verdict: Pass, Fail, WaitForSamples or Unavailable."""
    message: Annotated[str, Field(max_length=4096)] = ""
    """What the rollout is doing or waiting for, in words."""
    failed_revision: Annotated[str, Field(max_length=64)] = ""
    """A revision rolled back (or aborted): not tried again until the spec changes or the
    retry annotation asks for it."""
    handled: Annotated[dict[str, Annotated[str, Field(max_length=256)]], Field(max_length=8)] = {}
    """The value of each rollout action annotation (promote, abort, retry) last acted on: an
    action runs once per new value."""
    waiting_since: str | None = None
    """When the canary began to wait for its pods (a step's weight, or promoting the whole
    target) (RFC 3339); unset once they serve. `rollout.progressDeadlineSeconds` counts from
    here."""
    rollback_reason: Annotated[str, Field(max_length=64)] = ""
    """Why the canary was rolled back: `CanaryRolledBack` (a failed analysis), `CanaryAborted`
    (the abort annotation) or `CanaryProgressDeadlineExceeded` (its pods did not serve in
    time)."""


class StableSpec(ApiModel):
    """The parts of the spec that make the stable revision's pods, kept while a canary of a
    newer spec runs beside them."""

    model: ModelSpec
    """The stable revision's model."""
    runtime: RuntimeSpec
    """The stable revision's runtime, as its spec said it."""
    image: Annotated[str, Field(max_length=512)] = ""
    """The image its pods run: `runtime.image`, or the operator's default image then."""
    deployment_revision: Annotated[str, Field(max_length=64)] = ""
    """The revision its Deployments are named after (`<service>-<pool initial><6 hex>`): the
    canary it was promoted from. Empty: they are `<service>-<pool>`."""


class FloorMemory(ApiModel):
    """What the autoscaler measured of a pool whose minReplicas is unset (it chooses the floor:
    2 until the load is measured light, then 1), kept here so that a restarted autoscaler does
    not take a pool it had measured light back to 2."""

    observed_since: Annotated[str, Field(max_length=64)]
    """When the autoscaler first sized the pool (RFC 3339)."""
    busy_at: Annotated[str, Field(max_length=64)] | None = None
    """The last sizing that needed 2 replicas or more (RFC 3339); none yet when unset."""
    longest_lull_seconds: float = Field(ge=0, default=0.0)
    """Longest time between two such sizings (the quiet before the first included)."""


class SloMisses(ApiModel):
    """The rate window's requests over a pool's TTFT target, by cause: what more replicas would
    fix and what they would not (the autoscaler's reading of the engines' TTFT and prefill-time
    histograms, `goodput.capacity_misses`)."""

    bound_ms: float = Field(ge=0)
    """The histogram boundary the target was read at (the next one at or above it)."""
    requests: float = Field(ge=0)
    """Requests the window holds."""
    capacity: float = Field(ge=0)
    """Requests over the bound that waited for capacity: more replicas would have served them
    in time."""
    prompt_too_long: float = Field(ge=0)
    """Requests whose prefill alone took longer than the bound: they would miss the target on
    an idle engine, and no scaling fixes them."""


class AutoscalingPoolDecision(ApiModel):
    active: int = Field(ge=0)
    """Serving replicas the autoscaler wants."""
    spares: int = Field(ge=0, default=0)
    """Warm spares the autoscaler wants on top."""
    reason: Annotated[str, Field(max_length=1024)] = ""
    """Why (the policy's reason string)."""
    floor_memory: FloorMemory | None = None
    """What the autoscaler measured for its own floor (pools whose minReplicas is unset)."""
    ttft_misses: SloMisses | None = None
    """Requests over the TTFT target in the last rate window, by cause (prefill and unified
    pools with a TTFT target and requests in the window)."""


class AutoscalingStatus(ApiModel):
    pools: dict[str, AutoscalingPoolDecision] = {}
    """Decision per pool."""
    last_decision_time: str | None = None
    """When the autoscaler last decided (RFC 3339)."""
    limited: bool = False
    """True when the GPU budget or Pending pods stopped a scale-up."""
    message: Annotated[str, Field(max_length=4096)] = ""
    """Why scaling is limited, when it is."""
    metrics_missing_since: Annotated[str, Field(max_length=64)] | None = None
    """Since when (RFC 3339) every full pass has found no engine series in Prometheus for a
    pool with serving pods (`metricsMissingPools`); unset while the series arrive. The operator
    turns it into the MetricsMissing condition."""
    metrics_missing_pools: (
        Annotated[list[Annotated[str, Field(max_length=32)]], Field(max_length=3)] | None
    ) = None
    """The serving pools without engine series (unset with `metricsMissingSince`)."""


class InferenceServiceStatus(ApiModel):
    observed_generation: int | None = None
    """The spec generation the operator last acted on."""
    conditions: Annotated[list[Condition], Field(max_length=16)] = []
    """Ready, Progressing, Degraded, ScalingLimited, CanaryInProgress."""
    pools: dict[str, PoolStatus] = {}
    """Replica counts per pool (unified, or prefill and decode)."""
    serving: Annotated[str, Field(max_length=128)] = ""
    """Serving/desired replicas per pool, e.g. `prefill 2/2 decode 3/4` (a kubectl column)."""
    endpoint: Annotated[str, Field(max_length=512)] = ""
    """Where clients send requests for this service."""
    revision: Annotated[str, Field(max_length=64)] = ""
    """The stable revision: a hash of what makes the pods (model, runtime with its image,
    resources and env). A spec change that alters it rolls out by `spec.rollout.strategy`."""
    stable_spec: StableSpec | None = None
    """Model and runtime of `revision`, to run its pods while a canary of a newer spec runs."""
    canary: CanaryStatus | None = None
    """Canary progress, during (and after) a canary rollout."""
    autoscaling: AutoscalingStatus | None = None
    """Written only by the autoscaler."""


def _name_is_valid(service: InferenceService) -> bool:
    name = service.metadata.get("name")
    return name is None or (
        isinstance(name, str) and re.fullmatch(L.SERVICE_NAME_PATTERN, name) is not None
    )


def _name_fits(service: InferenceService) -> bool:
    name = service.metadata.get("name")
    return not isinstance(name, str) or len(name) <= L.SERVICE_NAME_MAX_LENGTH


class InferenceService(ApiModel):
    api_version: str = API_VERSION
    """llmfleet.dev/v1alpha1."""
    kind: str = KIND
    """InferenceService."""
    metadata: dict[str, Any] = {}
    """Standard object metadata."""
    spec: InferenceServiceSpec
    """What to serve and how."""
    status: InferenceServiceStatus | None = None
    """What the operator and autoscaler observed."""

    # The schema's root rules (the renderer puts them beside `metadata`, where CEL can read
    # `metadata.name`). A manifest without a name passes here: the API server requires one.
    rules = (
        Rule(
            cel=f"self.metadata.name.matches('{L.SERVICE_NAME_PATTERN}')",
            message="metadata.name must be a DNS label: lowercase letters, digits and '-', "
            "starting with a letter, no dots (the service's Kubernetes Services carry it)",
            field_path=".metadata.name",
            check=_name_is_valid,
        ),
        Rule(
            cel=f"self.metadata.name.size() <= {L.SERVICE_NAME_MAX_LENGTH}",
            message=f"metadata.name must be at most {L.SERVICE_NAME_MAX_LENGTH} characters, so "
            "that every child's name fits 63 ("
            + ", ".join(f"<name>-{suffix}" for suffix in L.CHILD_SUFFIXES)
            + ")",
            field_path=".metadata.name",
            check=_name_fits,
        ),
        Rule(
            cel="!has(self.spec.traffic) || !has(self.spec.traffic.cascade) || "
            "!has(self.spec.traffic.cascade.tiers) || "
            "self.spec.traffic.cascade.tiers.all(t, t.service != self.metadata.name)",
            message="traffic.cascade.tiers may not name this service itself: a tier is a "
            "cheaper service asked before this one",
            field_path=".spec.traffic.cascade.tiers",
            check=lambda s: all(
                t.service != s.metadata.get("name") for t in s.spec.traffic.cascade.tiers
            ),
        ),
        Rule(
            cel="!has(self.spec.traffic) || !has(self.spec.traffic.degradation) || "
            "!has(self.spec.traffic.degradation.service) || "
            "self.spec.traffic.degradation.service != self.metadata.name",
            message="traffic.degradation.service may not name this service itself: it is the "
            "cheaper service that takes sheddable requests when this one is saturated",
            field_path=".spec.traffic.degradation.service",
            check=lambda s: (
                s.spec.traffic.degradation.service != s.metadata.get("name")
                or s.spec.traffic.degradation.service is None
            ),
        ),
    )
