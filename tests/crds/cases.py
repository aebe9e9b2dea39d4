"""Invalid InferenceService manifests and what must be said about each (shared by the unit
test of the pydantic models and the cluster test against the real API server)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

SAMPLES_DIR = Path(__file__).resolve().parents[2] / "e2e" / "samples"
SAMPLES = sorted(SAMPLES_DIR.glob("*.yaml"))

BASE: dict[str, Any] = {
    "apiVersion": "llmfleet.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "bad"},
    "spec": {
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
        "runtime": {"gpu": {"type": "H100", "count": 4}},
        "topology": {"mode": "Unified", "unified": {"replicas": 2}},
    },
}
DISAGGREGATED = {
    "mode": "Disaggregated",
    "prefill": {"replicas": 1},
    "decode": {"replicas": 1},
    "kvTransfer": {"connector": "NixlConnector"},
}


@dataclass(frozen=True)
class Case:
    id: str
    changes: dict[str, Any]
    """Dotted path under `spec` -> new value (None deletes the field)."""
    field: str
    """The field the API server's message must name."""
    message: str = ""
    """Words our CEL rule says (empty for schema errors, whose wording is the API server's)."""

    def manifest(self) -> dict[str, Any]:
        manifest = copy.deepcopy(BASE)
        for path, value in self.changes.items():
            *parents, leaf = path.split(".")
            node = manifest["spec"]
            for key in parents:
                node = node.setdefault(key, {})
            if value is None:
                node.pop(leaf, None)
            else:
                node[leaf] = copy.deepcopy(value)
        return manifest

    def yaml(self) -> str:
        return yaml.safe_dump(self.manifest())


CASES = [
    Case("model-name-missing", {"model.name": None}, "spec.model.name"),
    Case("model-source-scheme", {"model.source": "ftp://host/model"}, "spec.model.source"),
    Case("gpu-type-unknown", {"runtime.gpu.type": "V100"}, "spec.runtime.gpu.type"),
    Case("gpu-count-zero", {"runtime.gpu.count": 0}, "spec.runtime.gpu.count"),
    Case("gpu-count-nine", {"runtime.gpu.count": 9}, "spec.runtime.gpu.count"),
    Case("tp-not-dividing", {"runtime.tensorParallel": 3}, "spec.runtime.tensorParallel",
         "tensorParallel must divide gpu.count"),
    Case("tp-above-gpus", {"runtime.tensorParallel": 8}, "spec.runtime.tensorParallel",
         "tensorParallel must divide gpu.count"),
    Case("kv-dtype-unknown", {"runtime.kvCacheDtype": "int4"}, "spec.runtime.kvCacheDtype"),
    Case("gpu-mem-zero", {"runtime.gpuMemoryUtilization": 0}, "spec.runtime.gpuMemoryUtilization"),
    Case("gpu-mem-above-one", {"runtime.gpuMemoryUtilization": 1.5},
         "spec.runtime.gpuMemoryUtilization"),
    Case("eagle-without-model", {"runtime.speculative": {"method": "eagle3"}},
         "spec.runtime.speculative.model", "need a model"),
    Case("spec-tokens-zero", {"runtime.speculative": {"method": "ngram", "numTokens": 0}},
         "spec.runtime.speculative.numTokens"),
    Case("env-name-invalid", {"runtime.env": [{"name": "1BAD", "value": "x"}]},
         "spec.runtime.env[0].name"),
    Case("mode-unknown", {"topology.mode": "Hybrid"}, "spec.topology.mode"),
    Case("disaggregated-without-decode",
         {"topology": DISAGGREGATED, "topology.decode": None},
         "spec.topology.mode", "needs both a prefill and a decode pool"),
    Case("disaggregated-without-connector",
         {"topology": DISAGGREGATED, "topology.kvTransfer": None},
         "spec.topology.kvTransfer", "needs kvTransfer.connector"),
    Case("disaggregated-with-unified",
         {"topology": {**DISAGGREGATED, "unified": {"replicas": 1}}},
         "spec.topology.unified", "has no unified pool"),
    Case("unified-with-prefill", {"topology.prefill": {"replicas": 1}}, "spec.topology.mode",
         "mode Unified takes only the unified pool"),
    Case("connector-unknown", {"topology": {**DISAGGREGATED, "kvTransfer": {"connector": "Foo"}}},
         "spec.topology.kvTransfer.connector"),
    Case("replicas-negative", {"topology.unified": {"replicas": -1}},
         "spec.topology.unified.replicas"),
    Case("min-above-replicas", {"topology.unified": {"replicas": 1, "minReplicas": 2}},
         "spec.topology.unified.minReplicas", "minReplicas must not exceed replicas"),
    Case("replicas-above-max", {"topology.unified": {"replicas": 5, "maxReplicas": 4}},
         "spec.topology.unified.replicas", "replicas must not exceed maxReplicas"),
    Case("decode-min-above-replicas",
         {"topology": {**DISAGGREGATED, "decode": {"replicas": 1, "minReplicas": 3}}},
         "spec.topology.decode.minReplicas", "minReplicas must not exceed replicas"),
    Case("ttft-zero", {"slo": {"ttftP95Ms": 0}}, "spec.slo.ttftP95Ms"),
    Case("itl-negative", {"slo": {"itlP95Ms": -5}}, "spec.slo.itlP95Ms"),
    Case("kv-usage-above-one", {"slo": {"maxKvCacheUsage": 1.2}}, "spec.slo.maxKvCacheUsage"),
    Case("spares-negative", {"autoscaling": {"warmSpares": -1}}, "spec.autoscaling.warmSpares"),
    Case("canary-without-steps", {"rollout": {"strategy": "Canary"}}, "spec.rollout.steps",
         "strategy Canary needs at least one step"),
    Case("canary-weights-fall",
         {"rollout": {"strategy": "Canary", "steps": [{"weight": 50}, {"weight": 20}]}},
         "spec.rollout.steps", "weights must rise"),
    Case("canary-weights-repeat",
         {"rollout": {"strategy": "Canary", "steps": [{"weight": 50}, {"weight": 50}]}},
         "spec.rollout.steps", "weights must rise"),
    Case("canary-weight-above-100",
         {"rollout": {"strategy": "Canary", "steps": [{"weight": 101}]}},
         "spec.rollout.steps[0].weight"),
    Case("debounce-mode-unknown", {"traffic": {"debounce": {"mode": "Sometimes"}}},
         "spec.traffic.debounce.mode"),
    Case("debounce-delay-above-window",
         {"traffic": {"debounce": {"mode": "LatestWins", "windowMs": 100, "delayMs": 200}}},
         "spec.traffic.debounce.delayMs", "debounce delayMs cannot exceed windowMs"),
    Case("degradation-without-cheaper-service", {"traffic": {"degradation": {"enabled": True}}},
         "spec.traffic.degradation.service", "degradation needs a cheaper service"),
    Case("cascade-confidence-unknown", {"traffic": {"cascade": {"confidence": "Vibes"}}},
         "spec.traffic.cascade.confidence"),
    Case("cascade-keyword-empty", {"traffic": {"cascade": {"hardKeywords": [""]}}},
         "spec.traffic.cascade.hardKeywords[0]"),
    Case("cascade-confidence-one",
         {"traffic": {"cascade": {"tiers": [{"service": "small", "escalateBelowConfidence": 1}]}}},
         "spec.traffic.cascade.tiers[0].escalateBelowConfidence"),
    Case("unknown-field", {"runtime.gpus": 2}, "spec.runtime.gpus"),
]  # fmt: skip
