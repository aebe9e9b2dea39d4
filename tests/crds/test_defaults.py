"""Defaults never refuse: for every pair of fields a rule relates, each field set alone, at either
end of its documented range, is accepted; where the rule is about a mode the spec does not
choose, or a default cannot follow, the message says which default applies and how to set it."""

from __future__ import annotations

from typing import Any

import pytest

from llmfleet.crds import InferenceService
from llmfleet.crds.validation import problems

MINIMAL: dict[str, Any] = {
    "apiVersion": "llmfleet.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "alone"},
    "spec": {"model": {"name": "org/model"}},
}


def alone(path: str, value: object) -> dict[str, Any]:
    """MINIMAL with one field under `spec` set (dotted path)."""
    manifest: dict[str, Any] = {**MINIMAL, "spec": {"model": {"name": "org/model"}}}
    *parents, leaf = path.split(".")
    node = manifest["spec"]
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return manifest


# (the rule, the field set alone, its value): each is accepted.
ACCEPTED = [
    ("minReplicas <= replicas", "topology.unified.minReplicas", 1000),
    ("minReplicas <= replicas", "topology.unified.replicas", 0),
    ("replicas <= maxReplicas", "topology.unified.maxReplicas", 1),
    ("replicas <= maxReplicas", "topology.unified.replicas", 1000),
    ("minReplicas <= maxReplicas", "topology.unified.minReplicas", 0),
    ("tensorParallel divides gpu.count", "runtime.gpu.count", 8),
    ("tensorParallel divides gpu.count", "runtime.tensorParallel", 1),
    ("maxBatchedTokens >= maxNumSeqs", "runtime.maxNumSeqs", 4096),
    ("maxBatchedTokens >= maxNumSeqs", "runtime.chunkedPrefill.maxBatchedTokens", 64),
    ("chunked off: maxBatchedTokens >= maxModelLen", "runtime.chunkedPrefill.enabled", False),
    ("chunked off: maxBatchedTokens >= maxModelLen", "model.maxModelLen", 10_485_760),
    ("gpuBudget >= replicas", "autoscaling.gpuBudget", 1),
    ("gpuBudget >= minimum footprint", "autoscaling.enabled", True),
    ("maxTokens < maxModelLen", "traffic.limits.maxTokens", 10_485_760),
    ("maxTokens < maxModelLen", "model.maxModelLen", 16),
    ("timeoutSeconds > ttftP95Ms", "traffic.limits.timeoutSeconds", 0.001),
    ("timeoutSeconds > ttftP95Ms", "slo.ttftP95Ms", 600_000),
    ("timeoutSeconds > debounce.delayMs", "traffic.debounce.mode", "LatestWins"),
    # (debounce's fields act with mode LatestWins: set alone, they are told below)
    ("debounce delayMs <= windowMs", "traffic.debounce", {"mode": "LatestWins", "delayMs": 0}),
    ("debounce delayMs <= windowMs", "traffic.debounce",
     {"mode": "LatestWins", "windowMs": 60_000}),
    ("nodeSelector fits the pods", "topology.unified.nodeSelector",
     {"nvidia.com/gpu.count": "1", "nvidia.com/gpu.family": "hopper"}),
    ("nodeSelector product", "topology.unified.nodeSelector",
     {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}),
    ("nodeSelector fits the pods", "runtime.gpu.count", 1),
    ("extraArgs parallel sizes vs gpu.count", "runtime.extraArgs", ["-tp", "1", "-dp", "1"]),
    ("extraArgs vs prefixCaching", "runtime.extraArgs", ["--enable-prefix-caching"]),
    ("extraArgs vs cudaGraphs", "runtime.extraArgs", ["-O3"]),
    ("extraArgs vs chunkedPrefill", "runtime.extraArgs", ["--no-enable-chunked-prefill"]),
    ("extraArgs vs prefixCaching", "runtime.prefixCaching", False),
    ("extraArgs vs cudaGraphs", "runtime.cudaGraphs", False),
    ("env vs the operator's", "runtime.env", [{"name": "POD_HOSTNAME", "value": "x"}]),
    ("ngram takes no model", "runtime.speculative", {"method": "ngram"}),
    ("hf source names the model", "model.source", "pvc://weights/org-model"),
    # Second round of issue 29: each side of the new relations, alone.
    ("limits >= requests", "runtime.resources", {"limits": {"cpu": "1m", "memory": "1Ki"}}),
    ("limits >= requests", "runtime.resources", {"requests": {"cpu": "64", "memory": "1Ti"}}),
    ("revision only for the hub", "model.revision", "main"),
    ("revision only for the hub", "model.source", "s3://bucket/model"),
    ("gpuBudget >= gpu.count", "runtime.gpu.count", 8),
    ("analysis.maxTtftP95Ms < timeoutSeconds", "rollout",
     {"strategy": "Canary", "steps": [{"weight": 10}], "analysis": {"maxTtftP95Ms": 1e9}}),
    ("speculative.model is not model.name", "runtime.speculative",
     {"method": "draft_model", "model": "org/draft"}),
    ("extraArgs budget vs maxNumSeqs", "runtime.extraArgs", ["--max-num-batched-tokens", "1"]),
    ("extraArgs budget vs maxNumSeqs", "runtime.extraArgs", ["--max-num-seqs", "1000000"]),
    ("extraArgs budget vs maxModelLen, chunked off", "runtime.chunkedPrefill",
     {"enabled": False}),
    ("extraArgs kv bytes vs gpuMemoryUtilization", "runtime.extraArgs",
     ["--kv-cache-memory-bytes", "1"]),
    ("extraArgs kv bytes vs gpuMemoryUtilization", "runtime.gpuMemoryUtilization", 0.01),
    ("extraArgs load format vs a streamed source", "runtime.extraArgs",
     ["--load-format", "safetensors"]),
    ("extraArgs load format vs a streamed source", "model.source", "gs://bucket/model"),
    ("nodeSelector gpu.memory of a product", "topology.unified.nodeSelector",
     {"nvidia.com/gpu.memory": "81559"}),
    # Third round: pipeline parallel, image names, the rollout-pause annotation.
    ("extraArgs pipeline parallel vs gpu.count", "runtime.extraArgs", ["-pp", "1"]),
    ("extraArgs pipeline parallel vs tensorParallel", "runtime.tensorParallel", 1),
    ("extraArgs pipeline parallel vs gpu.count", "runtime.gpu.count", 8),
    ("image name at most 255 as the kubelet reads it", "runtime.image", "a" * 237),
    ("image digest of a known algorithm", "runtime.image", "org/x@sha384:" + "b" * 96),
]  # fmt: skip

# (the rule, the field set alone, its value, words the message must hold: the default that
# refuses and what to set).
TOLD = [
    ("tensorParallel divides gpu.count", "runtime.tensorParallel", 8, "1 by default"),
    ("debounce delayMs <= windowMs", "traffic.debounce", {"mode": "LatestWins", "delayMs": 60_000},
     "by default 5 and 300"),
    ("debounce delayMs <= windowMs", "traffic.debounce", {"mode": "LatestWins", "windowMs": 0},
     "by default 5 and 300"),
    ("nodeSelector product", "topology.unified.nodeSelector",
     {"nvidia.com/gpu.product": "NVIDIA-L4"}, "H100 by default"),
    ("nodeSelector fits the pods", "topology.unified.nodeSelector",
     {"nvidia.com/gpu.family": "ampere"}, "H100 by default: set runtime.gpu.type"),
    ("extraArgs vs prefixCaching", "runtime.extraArgs", ["--disable-prefix-caching"],
     "(true, its default): set runtime.prefixCaching: false"),
    ("extraArgs vs cudaGraphs", "runtime.extraArgs", ["--enforce-eager"],
     "(true, its default): set runtime.cudaGraphs: false"),
    ("extraArgs parallel sizes vs gpu.count", "runtime.extraArgs", ["-dp", "2"],
     "runtime.gpu.count (1 by default"),
    ("extraArgs parallel sizes vs gpu.count", "runtime.extraArgs", ["-tp", "2"],
     "runtime.gpu.count (1 by default"),
    ("coalesce window needs coalesce", "traffic.coalesce.windowMs", 60_000,
     "while coalesce.enabled is false: set enabled: true"),
    ("hedge needs tiers", "traffic.cascade.hedge", True, "add cascade.tiers"),
    ("partial answers need a timeout", "traffic.limits.partialAnswers", True,
     "set timeoutSeconds"),
    ("nodeSelector gpu.memory of a product", "topology.unified.nodeSelector",
     {"nvidia.com/gpu.memory": "23034"}, "H100 by default: set runtime.gpu.type"),
    ("extraArgs pipeline parallel vs gpu.count", "runtime.extraArgs", ["-pp", "2"],
     "runtime.gpu.count (1 by default)"),
    # Options of a mode the spec does not choose: the mode's default is named, and what to set.
    ("debounce options need LatestWins", "traffic.debounce.windowMs", 60_000,
     "mode is Off (its default): set mode: LatestWins"),
    ("debounce options need LatestWins", "traffic.debounce.delayMs", 0,
     "mode is Off (its default): set mode: LatestWins"),
    ("canary options need Canary", "rollout.steps", [{"weight": 10}],
     "RollingUpdate (its default): set strategy: Canary"),
    ("canary options need Canary", "rollout.analysis", {"maxTtftP95Ms": 1e9},
     "RollingUpdate (its default): set strategy: Canary"),
    ("canary options need Canary", "rollout.progressDeadlineSeconds", 60,
     "RollingUpdate (its default): set strategy: Canary"),
    ("windowTokens needs MinWindowProbability", "traffic.cascade.windowTokens", 4096,
     "MeanProbability (its default): set confidence: MinWindowProbability"),
    ("degradation options need enabled", "traffic.degradation.service", "small",
     "(false by default): set enabled: true"),
    ("degradation options need enabled", "traffic.degradation.maxKvCacheUsage", 0.5,
     "(false by default): set enabled: true"),
    ("scale-down window needs autoscaling", "autoscaling.scaleDownStabilizationSeconds", 0,
     "false (its default): set enabled: true"),
]  # fmt: skip


@pytest.mark.parametrize(("rule", "path", "value"), ACCEPTED,
                         ids=[f"{path}={value}" for _, path, value in ACCEPTED])  # fmt: skip
def test_a_field_set_alone_is_accepted(rule: str, path: str, value: object) -> None:
    assert problems(alone(path, value)) == [], rule


@pytest.mark.parametrize(("rule", "path", "value", "said"), TOLD,
                         ids=[f"{path}={value}" for _, path, value, _ in TOLD])  # fmt: skip
def test_a_default_that_refuses_is_named_with_what_to_set(
    rule: str, path: str, value: object, said: str
) -> None:
    found = problems(alone(path, value))
    assert found, rule
    assert all(said in problem.message for problem in found), found


def test_an_older_spec_with_only_the_bounds_gets_replicas_between_them() -> None:
    """minReplicas 3 without replicas was refused over replicas' default of 1."""
    manifest = alone("topology.unified", {"minReplicas": 3, "maxReplicas": 5})
    assert problems(manifest) == []
    pool = InferenceService.model_validate(manifest).spec.pools()["unified"]
    assert (pool.min_replicas, pool.replicas, pool.max_replicas) == (3, 3, 5)
    unset = InferenceService.model_validate(alone("topology.unified", {"maxReplicas": 5}))
    assert unset.spec.pools()["unified"].replicas == 1


# Annotations the admission policy checks, each set alone (`metadata.annotations`).
ANNOTATIONS_ALONE = [
    {"llmfleet.dev/rollout-pause": "true"}, {"llmfleet.dev/rollout-pause": "false"},
    {"llmfleet.dev/rollout-promote": "2026-11-27T17:00:00Z"}, {"llmfleet.dev/rollout-abort": "1"},
    {"llmfleet.dev/rollout-retry": ""},
]  # fmt: skip


@pytest.mark.parametrize("annotations", ANNOTATIONS_ALONE, ids=str)
def test_a_rollout_annotation_set_alone_is_accepted(annotations: dict[str, str]) -> None:
    manifest = {**MINIMAL, "metadata": {"name": "alone", "annotations": annotations}}
    assert problems(manifest) == []
