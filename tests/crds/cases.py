"""Invalid InferenceService manifests and what must be said about each (shared by the unit
test of the pydantic models, the test of `llmfleet validate` and the cluster test against the
real API server)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmfleet.crds import kubectl_yaml
from llmfleet.crds.labels import SERVICE_NAME_MAX_LENGTH

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
SECRET_KEY = {"name": "hf", "key": "token"}
DISAGGREGATED = {
    "mode": "Disaggregated",
    "prefill": {"replicas": 1},
    "decode": {"replicas": 1},
    "kvTransfer": {"connector": "NixlConnector"},
}


def changed(changes: dict[str, Any]) -> dict[str, Any]:
    """BASE with `changes`: dotted path under `spec` (from the top when it starts with
    `metadata.`) -> new value (None deletes the field)."""
    manifest = copy.deepcopy(BASE)
    for path, value in changes.items():
        *parents, leaf = path.split(".")
        node = manifest if path.startswith("metadata.") else manifest["spec"]
        for key in parents:
            node = node.setdefault(key, {})
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = copy.deepcopy(value)
    return manifest


@dataclass(frozen=True)
class Case:
    id: str
    changes: dict[str, Any]
    """What makes BASE invalid (see `changed`)."""
    field: str
    """The field the API server's message and `llmfleet validate`'s line must name."""
    message: str = ""
    """Words our rule says: the CEL rule on the API server and its Python twin alike."""
    api_says: str = ""
    """For a refusal by the schema, not by our rule: words of the API server's message."""
    validate_says: str = ""
    """For a refusal by the schema: words of `llmfleet validate`'s line."""
    ratchets: bool = False
    """Our rule ratchets (`_base.Rule.ratchets`): admission refuses, the readers' models do not."""

    def manifest(self) -> dict[str, Any]:
        return changed(self.changes)

    def yaml(self) -> str:
        """As kubectl must read it: strings stay strings (`08192` is quoted)."""
        return kubectl_yaml.dump(self.manifest())


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
    # GPU selection by capability (issue 27): what no node can offer is refused.
    Case("gpu-mig-on-l4", {"runtime.gpu": {"type": "L4", "mig": "1g.10gb"}},
         "spec.runtime.gpu.mig", "gpu.mig is not a MIG profile of gpu.type"),
    Case("gpu-mig-of-another-type", {"runtime.gpu": {"type": "H100", "mig": "1g.18gb"}},
         "spec.runtime.gpu.mig", "gpu.mig is not a MIG profile of gpu.type"),
    Case("gpu-mig-not-a-profile", {"runtime.gpu": {"type": "H100", "mig": "half"}},
         "spec.runtime.gpu.mig", api_says="in body should match", validate_says="does not match"),
    Case("gpu-mig-with-several-gpus", {"runtime.gpu": {"type": "A100", "count": 2,
                                                       "mig": "3g.40gb"}},
         "spec.runtime.gpu.count", "gpu.mig gives each pod one MIG slice"),
    Case("gpu-memory-above-every-product", {"runtime.gpu": {"type": "H100", "minMemoryGB": 141}},
         "spec.runtime.gpu.minMemoryGB", "gpu.minMemoryGB is more than any product of gpu.type"),
    Case("gpu-memory-above-the-mig-slice", {"runtime.gpu": {"type": "A100", "mig": "3g.40gb",
                                                            "minMemoryGB": 41}},
         "spec.runtime.gpu.minMemoryGB", "gpu.mig's slice has less memory than gpu.minMemoryGB"),
    Case("gpu-memory-zero", {"runtime.gpu": {"minMemoryGB": 0}}, "spec.runtime.gpu.minMemoryGB",
         api_says="should be greater than or equal to 1", validate_says="at least 1"),
    Case("gpu-node-label-without-products",
         {"runtime.gpu": {"nodeLabel": "cloud.google.com/gke-accelerator"}},
         "spec.runtime.gpu.products", "gpu.nodeLabel needs gpu.products"),
    Case("gpu-products-and-memory", {"runtime.gpu": {"products": ["NVIDIA-H100-PCIe"],
                                                     "minMemoryGB": 80}},
         "spec.runtime.gpu.minMemoryGB", "gpu.products names the nodes to select itself"),
    Case("gpu-products-empty", {"runtime.gpu": {"products": []}}, "spec.runtime.gpu.products",
         api_says="should have at least 1 items", validate_says="at least 1"),
    Case("selector-product-below-the-memory",
         {"runtime.gpu": {"type": "A100", "minMemoryGB": 80},
          "topology.unified": {"nodeSelector": {
              "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}}},
         "spec.topology.unified.nodeSelector", "is not a product runtime.gpu selects"),
    Case("selector-product-not-listed",
         {"runtime.gpu": {"products": ["NVIDIA-H100-NVL"]},
          "topology.unified": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-PCIe"}}},
         "spec.topology.unified.nodeSelector", "is not a product runtime.gpu selects"),
    # Engine pods (issue 27): env from Secrets, the model cache and source, pod resources.
    Case("env-value-and-value-from",
         {"runtime.env": [{"name": "A", "value": "x", "valueFrom": {"secretKeyRef": SECRET_KEY}}]},
         "spec.runtime.env[0].valueFrom", "takes value or valueFrom, not both"),
    Case("env-value-from-two-sources",
         {"runtime.env": [{"name": "A", "valueFrom": {"secretKeyRef": SECRET_KEY,
                                                      "configMapKeyRef": SECRET_KEY}}]},
         "spec.runtime.env[0].valueFrom", "exactly one of secretKeyRef and configMapKeyRef"),
    Case("env-from-two-sources",
         {"runtime.envFrom": [{"secretRef": {"name": "s"}, "configMapRef": {"name": "c"}}]},
         "spec.runtime.envFrom[0]", "exactly one of secretRef and configMapRef"),
    Case("pvc-source-bad-claim", {"model.source": "pvc://Bad_Claim/weights"}, "spec.model.source",
         "a pvc:// source is pvc://<claim>/<path>"),
    Case("cache-claim-and-size", {"model.cache": {"claimName": "c", "sizeLimit": "10Gi"}},
         "spec.model.cache.sizeLimit", "remove it with claimName"),
    Case("shm-size-not-a-quantity", {"runtime.shmSize": "lots"}, "spec.runtime.shmSize"),
    Case("pull-secret-name-invalid", {"runtime.imagePullSecrets": [{"name": "Bad_Name"}]},
         "spec.runtime.imagePullSecrets[0].name"),
    Case("memory-not-a-quantity", {"runtime.resources": {"limits": {"memory": "a lot"}}},
         "spec.runtime.resources.limits.memory"),
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
    Case("canary-latency-ratio-below-one",
         {"rollout": {"strategy": "Canary", "steps": [{"weight": 10}],
                      "analysis": {"maxLatencyRatio": 0.9}}},
         "spec.rollout.analysis.maxLatencyRatio"),
    Case("canary-min-requests-zero", {"rollout": {"strategy": "Canary", "steps": [{"weight": 10}],
                                              "analysis": {"minRequests": 0}}},
         "spec.rollout.analysis.minRequests"),
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
    # Names the children could not carry.
    Case("name-with-dot", {"metadata.name": "llama-3.1-8b"}, "metadata.name",
         "metadata.name must be a DNS label"),
    Case("name-starts-with-digit", {"metadata.name": "8b-llama"}, "metadata.name",
         "metadata.name must be a DNS label"),
    Case("name-uppercase", {"metadata.name": "Llama-8B"}, "metadata.name",
         api_says="a lowercase RFC 1123 subdomain", validate_says="must be a DNS label"),
    Case("name-too-long", {"metadata.name": "llama-3-1-8b-instruct-" + "x" * 34}, "metadata.name",
         f"metadata.name must be at most {SERVICE_NAME_MAX_LENGTH} characters"),
    # Tolerations and env vars a Deployment would refuse.
    Case("toleration-exists-with-value",
         {"topology.unified": {"tolerations": [
             {"key": "dedicated", "operator": "Exists", "value": "llm"}]}},
         "spec.topology.unified.tolerations[0].value", "operator Exists matches every value"),
    Case("toleration-equal-without-key",
         {"topology.unified": {"tolerations": [{"operator": "Equal", "value": "llm"}]}},
         "spec.topology.unified.tolerations[0].operator", "without key"),
    Case("toleration-seconds-without-noexecute",
         {"topology.unified": {"tolerations": [
             {"key": "spot", "operator": "Exists", "effect": "NoSchedule",
              "tolerationSeconds": 30}]}},
         "spec.topology.unified.tolerations[0].tolerationSeconds",
         "tolerationSeconds needs effect NoExecute"),
    Case("toleration-operator-lowercase",
         {"topology.unified": {"tolerations": [{"key": "spot", "operator": "exists"}]}},
         "spec.topology.unified.tolerations[0].operator",
         api_says="should match '^(Exists|Equal)$'", validate_says="does not match"),
    Case("env-name-twice",
         {"runtime.env": [{"name": "HF_HOME", "value": "/a"}, {"name": "HF_HOME", "value": "/b"}]},
         "spec.runtime.env", api_says='duplicate entries for key [name="HF_HOME"]',
         validate_says="env names must be unique: HF_HOME given more than once"),
    Case("env-value-number", {"runtime.env": [{"name": "VLLM_LOGGING_LEVEL", "value": 1}]},
         # The API server names a list-map entry by its key, `llmfleet validate` by its index.
         "spec.runtime.env",
         api_says='env[name="VLLM_LOGGING_LEVEL"].value: expected string',
         validate_says="env[0].value: must be a string, not 1"),
    Case("env-as-mapping", {"runtime.env": {"HF_HOME": "/cache"}}, "spec.runtime.env",
         api_says="expected list", validate_says="must be a list, not a mapping"),
    # The GPU budget against what the spec itself asks for.
    Case("budget-below-replicas", {"autoscaling": {"gpuBudget": 6}},
         "spec.autoscaling.gpuBudget", "gpuBudget is below what the replicas need"),
    Case("budget-below-disaggregated-replicas",
         {"topology": {**DISAGGREGATED, "decode": {"replicas": 2}},
          "autoscaling": {"enabled": True, "gpuBudget": 8}},
         "spec.autoscaling.gpuBudget", "gpuBudget is below what the replicas need"),
    Case("budget-below-min-footprint",
         {"topology.unified": {"replicas": 0}, "autoscaling": {"enabled": True, "gpuBudget": 2}},
         "spec.autoscaling.gpuBudget", "gpuBudget is below the minimum footprint"),
    # Contradictions that would fail only on the cluster.
    Case("chunked-off-budget-below-context",
         {"model.maxModelLen": 32768,
          "runtime.chunkedPrefill": {"enabled": False, "maxBatchedTokens": 8192}},
         "spec.runtime.chunkedPrefill.maxBatchedTokens",
         "maxBatchedTokens must be at least model.maxModelLen"),
    Case("chunked-off-budget-without-context",
         {"runtime.chunkedPrefill": {"enabled": False, "maxBatchedTokens": 8192}},
         "spec.model.maxModelLen", "maxBatchedTokens needs model.maxModelLen"),
    Case("selector-names-another-gpu",
         {"topology.unified": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"}}},
         "spec.topology.unified.nodeSelector", "is not a product runtime.gpu selects"),
    Case("decode-selector-names-another-gpu",
         {"topology": {**DISAGGREGATED, "decode": {
             "replicas": 1, "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}}}},
         "spec.topology.decode.nodeSelector", "is not a product runtime.gpu selects"),
    Case("min-above-max", {"topology.unified": {"replicas": 2, "minReplicas": 3, "maxReplicas": 2}},
         "spec.topology.unified.minReplicas", "minReplicas must not exceed maxReplicas"),
    # Types and ranges, where the API server's words are poor and `llmfleet validate`'s are not.
    Case("timeout-with-unit", {"traffic": {"limits": {"timeoutSeconds": "30s"}}},
         "spec.traffic.limits.timeoutSeconds", api_says="expected numeric (int or float)",
         validate_says="write the number alone"),
    Case("stabilization-with-unit", {"autoscaling": {"scaleDownStabilizationSeconds": "5m"}},
         "spec.autoscaling.scaleDownStabilizationSeconds",
         api_says="expected numeric (int or float)", validate_says="write the number alone"),
    Case("replicas-as-string", {"topology.unified": {"replicas": "2"}},
         "spec.topology.unified.replicas", api_says="expected numeric (int or float)",
         validate_says='must be a whole number, not the string "2"'),
    Case("replicas-fraction", {"topology.unified": {"replicas": 1.5}},
         "spec.topology.unified.replicas", api_says="must be of type integer",
         validate_says="must be a whole number, not 1.5"),
    Case("replicas-beyond-int64", {"topology.unified": {"replicas": 10**20}},
         "spec.topology.unified.replicas", api_says="should be less than or equal to 1000",
         validate_says="must be at most 1000, not 100000000000000000000"),
    Case("toleration-seconds-beyond-int64",
         {"topology.unified": {"tolerations": [
             {"key": "spot", "operator": "Exists", "effect": "NoExecute",
              "tolerationSeconds": 2**64}]}},
         "spec.topology.unified.tolerations[0].tolerationSeconds",
         api_says="must be of type integer", validate_says=f"must be at most {2**53 - 1}"),
    Case("max-replicas-zero", {"topology.unified": {"replicas": 0, "maxReplicas": 0}},
         "spec.topology.unified.maxReplicas", api_says="should be greater than or equal to 1",
         validate_says="must be at least 1, not 0"),
    Case("gpu-type-lowercase", {"runtime.gpu.type": "h100"}, "spec.runtime.gpu.type",
         api_says='Unsupported value: "h100"', validate_says='not the string "h100"'),
    Case("gpu-as-list", {"runtime.gpu": ["H100", 4]}, "spec.runtime.gpu",
         api_says="expected map", validate_says="must be a mapping of fields, not a list"),
    Case("prefix-caching-as-string", {"runtime.prefixCaching": "yes"},
         "spec.runtime.prefixCaching", api_says="expected boolean",
         validate_says='must be true or false, not the string "yes"'),
    Case("replicas-beside-topology", {"replicas": 2}, "spec.replicas",
         api_says="field not declared in schema", validate_says="unknown field"),
    Case("selector-value-number", {"topology.unified": {"nodeSelector": {"gpu-count": 8}}},
         "spec.topology.unified.nodeSelector", api_says="expected string",
         validate_says="must be a string, not 8"),
    Case("selector-value-with-space", {"topology.unified": {"nodeSelector": {"pool": "big gpus"}}},
         "spec.topology.unified.nodeSelector", api_says="in body should match",
         validate_says='the string "big gpus" does not match'),
    Case("context-too-short", {"model.maxModelLen": 8}, "spec.model.maxModelLen",
         api_says="should be greater than or equal to 16", validate_says="must be at least 16"),
    Case("max-tokens-beyond-any-context", {"traffic": {"limits": {"maxTokens": 20_000_000}}},
         "spec.traffic.limits.maxTokens", api_says="should be less than or equal to 10485760",
         validate_says="must be at most 10485760"),
    # runtime.extraArgs the launcher refuses on every start (crds/engine_args.py).
    Case("extra-args-pasted-command-line",
         {"runtime.extraArgs": ["vllm serve meta-llama/Llama-3.1-8B-Instruct --max-num-seqs 64"]},
         "spec.runtime.extraArgs", "extraArgs must start with an option"),
    Case("extra-args-option-and-value-in-one-item", {"runtime.extraArgs": ["--max-num-seqs 128"]},
         "spec.runtime.extraArgs", "each item is one word"),
    Case("extra-args-port", {"runtime.extraArgs": ["--port", "9000"]},
         "spec.runtime.extraArgs", "the launcher sets them"),
    Case("extra-args-model-option", {"runtime.extraArgs": ["--model", "meta-llama/Other"]},
         "spec.runtime.extraArgs", "the launcher sets them"),
    Case("extra-args-served-name-underscored", {"runtime.extraArgs": ["--served_model_name=chat"]},
         "spec.runtime.extraArgs", "the launcher sets them"),
    Case("extra-args-metrics-off", {"runtime.extraArgs": ["--disable-log-stats"]},
         "spec.runtime.extraArgs", "may not set --disable-log-stats"),
    Case("extra-args-alias-and-long-name",
         {"runtime.extraArgs": ["-tp", "2", "--tensor-parallel-size=2"]},
         "spec.runtime.extraArgs", "set one option twice"),
    Case("extra-args-eager-and-level", {"runtime.extraArgs": ["--enforce-eager", "-O3"]},
         "spec.runtime.extraArgs", "set one option twice"),
    Case("extra-args-same-option-two-spellings",
         {"runtime.extraArgs": ["--max-loras", "2", "--max_loras", "4"]},
         "spec.runtime.extraArgs", "set one option twice"),
    Case("extra-args-contradict-tensor-parallel",
         {"runtime.tensorParallel": 2, "runtime.extraArgs": ["-tp", "4"]},
         "spec.runtime.extraArgs", "--tensor-parallel-size contradicts runtime.tensorParallel"),
    Case("extra-args-contradict-context",
         {"model.maxModelLen": 8192, "runtime.extraArgs": ["--max-model-len=4096"]},
         "spec.runtime.extraArgs", "--max-model-len contradicts model.maxModelLen"),
    Case("extra-args-contradict-memory-share",
         {"runtime.gpuMemoryUtilization": 0.8,
          "runtime.extraArgs": ["--gpu-memory-utilization", "0.95"]},
         "spec.runtime.extraArgs",
         "--gpu-memory-utilization contradicts runtime.gpuMemoryUtilization"),
    Case("extra-args-contradict-quantization",
         {"runtime.quantization": "awq", "runtime.extraArgs": ["-q", "gptq"]},
         "spec.runtime.extraArgs", "--quantization contradicts runtime.quantization"),
    Case("extra-args-eager-vs-default-graphs", {"runtime.extraArgs": ["--enforce-eager"]},
         "spec.runtime.extraArgs", "contradicts runtime.cudaGraphs (true, its default)"),
    Case("extra-args-level-zero", {"runtime.extraArgs": ["-O0"]},
         "spec.runtime.extraArgs", "contradicts runtime.cudaGraphs (true, its default)"),
    Case("extra-args-level-vs-eager-field",
         {"runtime.cudaGraphs": False, "runtime.extraArgs": ["-O3"]},
         "spec.runtime.extraArgs", "contradicts runtime.cudaGraphs (false)"),
    Case("extra-args-prefix-caching-off-by-old-spelling",
         {"runtime.extraArgs": ["--no-enable-prefix-caching"]},
         "spec.runtime.extraArgs", "contradicts runtime.prefixCaching (true, its default)"),
    Case("extra-args-chunked-on-vs-off",
         {"runtime.chunkedPrefill": {"enabled": False},
          "runtime.extraArgs": ["--enable-chunked-prefill"]},
         "spec.runtime.extraArgs", "contradicts runtime.chunkedPrefill.enabled (false)"),
    Case("extra-args-speculative-config-beside-field",
         {"runtime.speculative": {"method": "ngram"},
          "runtime.extraArgs": ["--speculative-config", '{"method":"ngram"}']},
         "spec.runtime.extraArgs", "--speculative-config contradicts runtime.speculative"),
    Case("extra-args-kv-transfer-in-disaggregated",
         {"topology": DISAGGREGATED,
          "runtime.extraArgs": ["--kv-transfer-config", '{"kv_connector":"NixlConnector"}']},
         "spec.runtime.extraArgs", "--kv-transfer-config contradicts topology.kvTransfer"),
    Case("extra-args-data-parallel-beyond-the-gpus", {"runtime.extraArgs": ["-dp", "2"]},
         "spec.runtime.extraArgs", "ask for more GPUs than a pod has"),
    Case("extra-args-tensor-parallel-beyond-the-gpus",
         {"runtime.extraArgs": ["--tensor-parallel-size=8"]},
         "spec.runtime.extraArgs", "ask for more GPUs than a pod has"),
    # Engine limits vLLM refuses at start.
    Case("batched-tokens-below-max-seqs",
         {"runtime.maxNumSeqs": 512, "runtime.chunkedPrefill": {"maxBatchedTokens": 256}},
         "spec.runtime.chunkedPrefill.maxBatchedTokens",
         "maxBatchedTokens must be at least maxNumSeqs"),
    # Env the operator sets itself, and children the API server would not store.
    Case("env-pod-ip", {"runtime.env": [{"name": "POD_IP", "value": "10.0.0.1"}]},
         "spec.runtime.env", "are set by the operator"),
    Case("env-drain-seconds", {"runtime.env": [{"name": "LLMFLEET_DRAIN_SECONDS", "value": "5"}]},
         "spec.runtime.env", "are set by the operator"),
    Case("env-too-large-for-the-config-map",
         {"runtime.env": [{"name": f"BLOB_{i}", "value": "x" * 30_000} for i in range(3)]},
         "spec.runtime.env", "env values and extraArgs hold at most 65536 characters"),
    # Strings that end up in other objects: image references, GPU node labels.
    Case("image-uppercase-path", {"runtime.image": "ghcr.io/LLMFleet/runtime:0.1.0"},
         "spec.runtime.image", api_says="should match", validate_says="does not match"),
    Case("image-with-space", {"runtime.image": "vllm/vllm-openai: v0.33.0"},
         "spec.runtime.image", api_says="should match", validate_says="does not match"),
    Case("image-as-url", {"runtime.image": "https://ghcr.io/llmfleet/runtime:0.1.0"},
         "spec.runtime.image", api_says="should match", validate_says="does not match"),
    Case("selector-key-with-space", {"topology.unified": {"nodeSelector": {"gpu type": "h100"}}},
         "spec.topology.unified.nodeSelector", "nodeSelector keys are label keys"),
    Case("selector-key-name-too-long",
         {"topology.unified": {"nodeSelector": {"example.com/" + "n" * 64: "yes"}}},
         "spec.topology.unified.nodeSelector", "nodeSelector keys are label keys"),
    Case("selector-gpu-count-below-pod",
         {"topology.unified": {"nodeSelector": {"nvidia.com/gpu.count": "2"}}},
         "spec.topology.unified.nodeSelector", "asks for nodes no pod of this spec fits on"),
    Case("selector-gpu-family-other",
         {"topology.unified": {"nodeSelector": {"nvidia.com/gpu.family": "ampere"}}},
         "spec.topology.unified.nodeSelector", "asks for nodes no pod of this spec fits on"),
    Case("decode-selector-gpu-absent",
         {"topology": {**DISAGGREGATED, "decode": {
             "replicas": 1, "nodeSelector": {"nvidia.com/gpu.present": "false"}}}},
         "spec.topology.decode.nodeSelector", "asks for nodes no pod of this spec fits on"),
    # Names of other services: names an InferenceService can have, never its own.
    Case("cascade-tier-uppercase", {"traffic": {"cascade": {"tiers": [{"service": "Small"}]}}},
         "spec.traffic.cascade.tiers[0].service", api_says="should match",
         validate_says="does not match"),
    Case("cascade-tier-digit-first", {"traffic": {"cascade": {"tiers": [{"service": "8b"}]}}},
         "spec.traffic.cascade.tiers[0].service", api_says="should match",
         validate_says="does not match"),
    Case("degradation-service-too-long",
         {"traffic": {"degradation": {"enabled": True, "service": "s" * 56}}},
         "spec.traffic.degradation.service", api_says="Too long",
         validate_says="must have at most 55 characters"),
    Case("cascade-tier-is-itself", {"traffic": {"cascade": {"tiers": [{"service": "bad"}]}}},
         "spec.traffic.cascade.tiers", "may not name this service itself"),
    Case("degradation-to-itself",
         {"traffic": {"degradation": {"enabled": True, "service": "bad"}}},
         "spec.traffic.degradation.service", "may not name this service itself"),
    Case("cascade-tier-twice",
         {"traffic": {"cascade": {"tiers": [{"service": "small"}, {"service": "small"}]}}},
         "spec.traffic.cascade.tiers", "name each service once"),
    Case("hard-keyword-twice-in-two-cases",
         {"traffic": {"cascade": {"hardKeywords": ["Explain", "explain"]}}},
         "spec.traffic.cascade.hardKeywords", "name each word once"),
    # Relations between fields that make the spec pointless.
    Case("token-cap-at-context",
         {"model.maxModelLen": 4096, "traffic": {"limits": {"maxTokens": 4096}}},
         "spec.traffic.limits.maxTokens", "maxTokens must be below model.maxModelLen"),
    Case("timeout-below-ttft-target",
         {"slo": {"ttftP95Ms": 5000}, "traffic": {"limits": {"timeoutSeconds": 2}}},
         "spec.traffic.limits.timeoutSeconds", "must be longer than slo.ttftP95Ms"),
    Case("timeout-below-debounce-hold",
         {"traffic": {"debounce": {"mode": "LatestWins", "windowMs": 1000, "delayMs": 500},
                      "limits": {"timeoutSeconds": 0.2}}},
         "spec.traffic.limits.timeoutSeconds", "must be longer than debounce.delayMs"),
    Case("coalesce-window-while-off", {"traffic": {"coalesce": {"windowMs": 2000}}},
         "spec.traffic.coalesce.windowMs", "does nothing while coalesce.enabled is false"),
    Case("hedge-without-tiers", {"traffic": {"cascade": {"hedge": True}}},
         "spec.traffic.cascade.hedge", "needs a tier to hedge with"),
    Case("partial-answers-without-timeout", {"traffic": {"limits": {"partialAnswers": True}}},
         "spec.traffic.limits.partialAnswers", "acts at limits.timeoutSeconds"),
    Case("ngram-with-a-model",
         {"runtime.speculative": {"method": "ngram", "model": "meta-llama/Llama-3.2-1B"}},
         "spec.runtime.speculative.model", "ngram proposes tokens from the prompt itself"),
    # Labels and annotations: the API server checks them on every object.
    Case("label-value-boolean", {"metadata.labels": {"canary": True}}, "metadata.labels",
         api_says="cannot unmarshal bool", validate_says="must be a string, not true"),
    Case("label-key-invalid", {"metadata.labels": {"-team": "llm"}}, "metadata.labels",
         api_says="name part must consist of", validate_says="not a valid key"),
    Case("label-value-too-long", {"metadata.labels": {"team": "x" * 64}}, "metadata.labels",
         api_says="must be no more than 63 bytes", validate_says="not a valid label value"),
    Case("rollout-pause-unquoted",
         {"metadata.annotations": {"llmfleet.dev/rollout-pause": True}}, "metadata.annotations",
         api_says="cannot unmarshal bool", validate_says="must be a string, not true"),
    Case("annotation-key-with-space",
         {"metadata.annotations": {"llmfleet.dev/rollout pause": "true"}},
         "metadata.annotations", api_says="name part must consist of",
         validate_says="not a valid key"),
    # extraArgs the launcher refuses, second round: flags that cut the engine off its callers.
    Case("extra-args-api-key", {"runtime.extraArgs": ["--api-key", "s3cret"]},
         "spec.runtime.extraArgs", "may not set --api-key"),
    Case("extra-args-tls", {"runtime.extraArgs": ["--ssl-keyfile=/tls/key.pem"]},
         "spec.runtime.extraArgs", "may not set --ssl-keyfile"),
    Case("extra-args-tls-cert-underscored", {"runtime.extraArgs": ["--ssl_certfile", "/c.pem"]},
         "spec.runtime.extraArgs", "may not set --ssl-certfile"),
    Case("extra-args-headless", {"runtime.extraArgs": ["--headless"]},
         "spec.runtime.extraArgs", "may not set --headless"),
    Case("extra-args-unix-socket", {"runtime.extraArgs": ["--uds", "/tmp/engine.sock"]},
         "spec.runtime.extraArgs", "the launcher sets them"),
    Case("extra-args-value-missing", {"runtime.extraArgs": ["--max-num-seqs", "--enable-lora"]},
         "spec.runtime.extraArgs", "takes one value none, or several"),
    Case("extra-args-two-values", {"runtime.extraArgs": ["-dp", "2", "2"]},
         "spec.runtime.extraArgs", "takes one value none, or several"),
    Case("extra-args-memory-share-above-one",
         {"runtime.extraArgs": ["--gpu-memory-utilization", "1.5"]},
         "spec.runtime.extraArgs", "a number vLLM refuses"),
    Case("extra-args-tensor-parallel-zero", {"runtime.extraArgs": ["-tp=0"]},
         "spec.runtime.extraArgs", "a number vLLM refuses"),
    # Not a whole number: vLLM's parser refuses it; the launcher plans GPUs from it.
    Case("extra-args-data-parallel-empty", {"runtime.extraArgs": ["-dp", ""]},
         "spec.runtime.extraArgs", "a number vLLM refuses"),
    Case("extra-args-max-seqs-fraction", {"runtime.extraArgs": ["--max-num-seqs", "1.5"]},
         "spec.runtime.extraArgs", "a number vLLM refuses"),
    Case("extra-args-kv-bytes-beside-memory-share",
         {"runtime.gpuMemoryUtilization": 0.8,
          "runtime.extraArgs": ["--kv-cache-memory-bytes", "8589934592"]},
         "spec.runtime.extraArgs", "both size the KV cache"),
    Case("extra-args-load-format-of-a-streamed-source",
         {"model.source": "s3://models/llama-8b",
          "runtime.extraArgs": ["--load_format=safetensors"]},
         "spec.runtime.extraArgs", "--load-format contradicts model.source"),
    # Engine limits vLLM refuses at start, one side in extraArgs.
    Case("extra-args-budget-below-max-seqs",
         {"runtime.maxNumSeqs": 512, "runtime.extraArgs": ["--max-num-batched-tokens=256"]},
         "spec.runtime.extraArgs", "--max-num-batched-tokens is below runtime.maxNumSeqs"),
    Case("extra-args-max-seqs-above-budget",
         {"runtime.chunkedPrefill": {"maxBatchedTokens": 256},
          "runtime.extraArgs": ["--max_num_seqs", "512"]},
         "spec.runtime.extraArgs", "--max-num-seqs is above runtime.chunkedPrefill"),
    Case("extra-args-chunked-off-budget-below-context",
         {"model.maxModelLen": 8192, "runtime.chunkedPrefill": {"enabled": False},
          "runtime.extraArgs": ["--max-num-batched-tokens", "4096"]},
         "spec.runtime.extraArgs", "is below model.maxModelLen with chunked prefill off"),
    # Env the launcher sets for the engine.
    Case("env-nixl-side-channel-host",
         {"topology": DISAGGREGATED,
          "runtime.env": [{"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "value": "0.0.0.0"}]},
         "spec.runtime.env", "are set by the runtime launcher"),
    # Strings that reach other tools: the hub, git, the kubelet.
    Case("model-name-is-a-url", {"model.name": "hf://meta-llama/Llama-3.1-8B-Instruct"},
         "spec.model.name", "must be a hub repository id"),
    Case("model-name-with-space", {"model.name": "meta-llama/Llama 3.1 8B"},
         "spec.model.name", "must be a hub repository id"),
    Case("model-name-with-revision", {"model.name": "meta-llama/Llama-3.1-8B-Instruct@main"},
         "spec.model.name", "must be a hub repository id"),
    Case("hf-source-with-revision", {"model.source": "hf://meta-llama/Llama-3.1-8B-Instruct@v2"},
         "spec.model.source", "an hf:// source is hf://<org>/<name>"),
    Case("pvc-source-climbs-out", {"model.source": "pvc://weights/../../etc"},
         "spec.model.source", "may not hold '.' or '..' segments"),
    Case("revision-with-space", {"model.revision": "main branch"}, "spec.model.revision",
         "model.revision is a branch, tag or commit"),
    Case("revision-of-a-pvc-source",
         {"model.source": "pvc://weights/llama-8b", "model.revision": "main"},
         "spec.model.revision", "model.source is not the hub"),
    Case("speculative-model-is-a-url",
         {"runtime.speculative": {"method": "draft_model", "model": "hf://meta-llama/Llama-3.2-1B"}},
         "spec.runtime.speculative.model", "not a URL"),
    Case("image-digest-too-short", {"runtime.image": "vllm/vllm-openai@sha256:" + "a" * 40},
         "spec.runtime.image", "64 lowercase hex digits"),
    Case("image-digest-uppercase", {"runtime.image": "vllm/vllm-openai@sha256:" + "A" * 64},
         "spec.runtime.image", "64 lowercase hex digits"),
    # Relations that make the spec impossible or pointless.
    Case("draft-is-the-model",
         {"runtime.speculative": {"method": "draft_model",
                                  "model": "meta-llama/Llama-3.1-8B-Instruct"}},
         "spec.runtime.speculative.model", "is model.name itself"),
    Case("memory-limit-below-request",
         {"runtime.resources": {"requests": {"memory": "64Gi"}, "limits": {"memory": "32Gi"}}},
         "spec.runtime.resources.limits.memory", "limits.memory is below requests.memory"),
    Case("cpu-limit-below-request",
         {"runtime.resources": {"requests": {"cpu": "8"}, "limits": {"cpu": "4000m"}}},
         "spec.runtime.resources.limits.cpu", "limits.cpu is below requests.cpu"),
    Case("selector-node-label-outside-products",
         {"runtime.gpu": {"nodeLabel": "cloud.google.com/gke-accelerator",
                          "products": ["nvidia-h100-80gb"]},
          "topology.unified": {"replicas": 2, "nodeSelector": {
              "cloud.google.com/gke-accelerator": "nvidia-l4"}}},
         "spec.topology.unified.nodeSelector", "is not in runtime.gpu.products"),
    Case("selector-gpu-memory-of-no-product",
         {"topology.unified": {"replicas": 2, "nodeSelector": {"nvidia.com/gpu.memory": "40960"}}},
         "spec.topology.unified.nodeSelector", "asks for nodes no pod of this spec fits on"),
    Case("budget-below-one-pod",
         {"topology.unified": {"replicas": 0, "minReplicas": 0},
          "autoscaling": {"enabled": True, "gpuBudget": 2}},
         "spec.autoscaling.gpuBudget", "below one pod's GPUs"),
    Case("analysis-ttft-limit-beyond-the-timeout",
         {"traffic": {"limits": {"timeoutSeconds": 30}},
          "rollout": {"strategy": "Canary", "steps": [{"weight": 10}],
                      "analysis": {"maxTtftP95Ms": 30000}}},
         "spec.rollout.analysis.maxTtftP95Ms", "must be below traffic.limits.timeoutSeconds"),
    Case("extra-args-tensor-parallel-not-dividing", {"runtime.extraArgs": ["-tp", "3"]},
         "spec.runtime.extraArgs", "--tensor-parallel-size must divide runtime.gpu.count"),
    Case("token-cap-at-the-extra-args-context",
         {"runtime.extraArgs": ["--max-model-len", "4096"],
          "traffic": {"limits": {"maxTokens": 4096}}},
         "spec.traffic.limits.maxTokens", "below the context runtime.extraArgs --max-model-len"),
    Case("selector-mig-strategy-single-with-mig-slices",
         {"runtime.gpu": {"type": "A100", "mig": "1g.5gb"},
          "topology.unified": {"replicas": 2,
                               "nodeSelector": {"nvidia.com/mig.strategy": "single"}}},
         "spec.topology.unified.nodeSelector", "asks for nodes no pod of this spec fits on"),
    Case("selector-mig-incapable-with-mig-slices",
         {"runtime.gpu": {"type": "H100", "mig": "1g.10gb"},
          "topology.unified": {"replicas": 2, "nodeSelector": {"nvidia.com/mig.capable": "false"}}},
         "spec.topology.unified.nodeSelector", "asks for nodes no pod of this spec fits on"),
    # Lists with duplicates.
    Case("gpu-products-twice",
         {"runtime.gpu": {"products": ["NVIDIA-H100-PCIe", "NVIDIA-H100-PCIe"]}},
         "spec.runtime.gpu.products", "name each product once"),
    Case("pull-secret-twice", {"runtime.imagePullSecrets": [{"name": "ghcr"}, {"name": "ghcr"}]},
         "spec.runtime.imagePullSecrets", "name each Secret once"),
    Case("env-from-the-same-secret-twice",
         {"runtime.envFrom": [{"secretRef": {"name": "hf"}}, {"secretRef": {"name": "hf"}}]},
         "spec.runtime.envFrom", "names each source once"),
    # Pipeline parallel (-pp): one engine takes tensor x pipeline GPUs, dividing the pod's.
    Case("extra-args-pipeline-not-dividing", {"runtime.extraArgs": ["-pp", "3"]},
         "spec.runtime.extraArgs", "parallel sizes do not fit runtime.gpu.count"),
    Case("extra-args-pipeline-beside-all-the-tensor-parallel",
         {"runtime.tensorParallel": 4, "runtime.extraArgs": ["--pipeline-parallel-size=2"]},
         "spec.runtime.extraArgs", "parallel sizes do not fit runtime.gpu.count"),
    Case("extra-args-pipeline-with-data-parallel-beyond-the-gpus",
         {"runtime.extraArgs": ["-tp", "2", "--pipeline_parallel_size", "2", "-dp", "2"]},
         "spec.runtime.extraArgs", "parallel sizes do not fit runtime.gpu.count"),
    Case("extra-args-pipeline-leaves-gpus-idle",
         {"runtime.gpu.count": 8, "runtime.extraArgs": ["-tp", "2", "-pp", "3"]},
         "spec.runtime.extraArgs", "parallel sizes do not fit runtime.gpu.count"),
    # ... and without -pp (pipeline 1): -tp x -dp engines' GPUs, as vLLM counts them.
    Case("extra-args-tensor-by-data-beyond-the-gpus",
         {"runtime.gpu.count": 2, "runtime.extraArgs": ["-tp", "2", "-dp", "2"]},
         "spec.runtime.extraArgs", "parallel sizes do not fit runtime.gpu.count"),
    Case("extra-args-tensor-by-data-beyond-the-gpus-other-spellings",
         {"runtime.extraArgs": ["--data_parallel_size=3", "--tensor-parallel-size", "2"]},
         "spec.runtime.extraArgs", "parallel sizes do not fit runtime.gpu.count"),
    Case("extra-args-pipeline-zero", {"runtime.extraArgs": ["-pp=0"]},
         "spec.runtime.extraArgs", "a number vLLM refuses"),
    Case("extra-args-pipeline-twice", {"runtime.extraArgs": ["-pp", "2", "--pipeline-parallel-size",
                                                             "2"]},
         "spec.runtime.extraArgs", "set one option twice"),
    Case("extra-args-pipeline-without-value", {"runtime.extraArgs": ["-pp", "--enable-lora"]},
         "spec.runtime.extraArgs", "takes one value none, or several"),
    # Options of a mode the spec does not choose (they would do nothing): refused at admission,
    # ratcheted for objects stored before the rules, ignored by the readers.
    Case("rollout-steps-without-canary", {"rollout": {"steps": [{"weight": 10}]}},
         "spec.rollout.steps", "rollout.steps are a canary's, and rollout.strategy is "
         "RollingUpdate (its default)", ratchets=True),
    Case("rollout-analysis-without-canary",
         {"rollout": {"strategy": "RollingUpdate", "analysis": {"maxErrorRate": 0.05}}},
         "spec.rollout.analysis", "rollout.analysis judges a canary", ratchets=True),
    Case("rollout-deadline-without-canary", {"rollout": {"progressDeadlineSeconds": 600}},
         "spec.rollout.progressDeadlineSeconds", "limits a canary's steps", ratchets=True),
    Case("debounce-window-while-off", {"traffic": {"debounce": {"windowMs": 1000}}},
         "spec.traffic.debounce.windowMs", "acts only with debounce.mode LatestWins",
         ratchets=True),
    Case("debounce-delay-while-off", {"traffic": {"debounce": {"mode": "Off", "delayMs": 0}}},
         "spec.traffic.debounce.delayMs", "debounce.delayMs acts only with debounce.mode "
         "LatestWins, and mode is Off", ratchets=True),
    Case("cascade-window-of-mean-probability",
         {"traffic": {"cascade": {"tiers": [{"service": "small"}], "windowTokens": 16}}},
         "spec.traffic.cascade.windowTokens", "is the window of confidence MinWindowProbability",
         ratchets=True),
    Case("degradation-service-while-off", {"traffic": {"degradation": {"service": "small"}}},
         "spec.traffic.degradation.enabled", "act only while degradation.enabled is true",
         ratchets=True),
    Case("degradation-queue-depth-while-off",
         {"traffic": {"degradation": {"enabled": False, "maxQueueDepth": 8}}},
         "spec.traffic.degradation.enabled", "act only while degradation.enabled is true",
         ratchets=True),
    Case("scale-down-window-without-autoscaling",
         {"autoscaling": {"scaleDownStabilizationSeconds": 60}},
         "spec.autoscaling.scaleDownStabilizationSeconds",
         "acts only with autoscaling.enabled true", ratchets=True),
    # Image references the kubelet cannot pull: a name over 255 characters as it reads it
    # (Docker Hub's docker.io/library/ counted), a digest of another length or algorithm, an ID.
    Case("image-name-too-long",
         {"runtime.image": "registry.example.com/" + "a" * 235 + ":v1"},
         "spec.runtime.image", "name must be at most 255 characters as the kubelet reads it"),
    Case("image-hub-name-too-long-with-its-library",
         {"runtime.image": "a" * 238}, "spec.runtime.image",
         "name must be at most 255 characters as the kubelet reads it"),
    Case("image-hub-name-too-long-with-docker-io",
         {"runtime.image": "org/" + "a" * 242 + ":latest"}, "spec.runtime.image",
         "name must be at most 255 characters as the kubelet reads it"),
    Case("image-digest-sha512-too-short", {"runtime.image": "vllm/vllm-openai@sha512:" + "a" * 64},
         "spec.runtime.image", "sha512 with 128"),
    Case("image-digest-unknown-algorithm", {"runtime.image": "vllm/vllm-openai@md5:" + "a" * 32},
         "spec.runtime.image", "sha256 with 64 lowercase hex digits"),
    Case("image-is-an-image-id", {"runtime.image": "0123456789abcdef" * 4},
         "spec.runtime.image", "may not be 64 hex digits alone"),
    # The rollout annotations, checked by the admission policy: a value or a key llmfleet would
    # not act on as written.
    Case("rollout-pause-yes", {"metadata.annotations": {"llmfleet.dev/rollout-pause": "yes"}},
         "metadata.annotations[llmfleet.dev/rollout-pause]", 'must be "true"'),
    Case("rollout-pause-capitalised",
         {"metadata.annotations": {"llmfleet.dev/rollout-pause": "True"}},
         "metadata.annotations[llmfleet.dev/rollout-pause]", 'must be "true"'),
    Case("rollout-pause-empty", {"metadata.annotations": {"llmfleet.dev/rollout-pause": ""}},
         "metadata.annotations[llmfleet.dev/rollout-pause]", 'must be "true"'),
    Case("rollout-annotation-misspelt",
         {"metadata.annotations": {"llmfleet.dev/rollout-paused": "true"}},
         "metadata.annotations", "another one acts on nothing"),
    # A word kubectl reads as a number unless the table's YAML quotes it (`Case.yaml`).
    Case("extra-args-context-with-a-leading-zero-contradicts",
         {"model.maxModelLen": 8192, "runtime.extraArgs": ["--max-model-len", "08193"]},
         "spec.runtime.extraArgs", "--max-model-len contradicts model.maxModelLen"),
]  # fmt: skip


VALID_AT_THE_EDGE = {
    "name-at-the-limit": changed({"metadata.name": "l" + "x" * (SERVICE_NAME_MAX_LENGTH - 1)}),
    "toleration-exists-without-value": changed({"topology.unified": {"tolerations": [
        {"operator": "Exists"},
        {"key": "spot", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60},
    ]}}),
    "env-names-once-each": changed({"runtime.env": [
        {"name": "HF_HOME", "value": "/cache"}, {"name": "HF_HUB_OFFLINE", "value": "1"}]}),
    "budget-equal-to-replicas": changed({"autoscaling": {"warmSpares": 2, "gpuBudget": 8}}),
    "budget-equal-to-min-footprint": changed({
        "topology.unified": {"replicas": 1}, "autoscaling": {"enabled": True, "gpuBudget": 4}}),
    "budget-with-min-replicas-zero": changed({
        "topology.unified": {"replicas": 0, "minReplicas": 0},
        "autoscaling": {"enabled": True, "gpuBudget": 4}}),
    "chunked-off-budget-equal-to-context": changed({
        "model.maxModelLen": 8192,
        "runtime.chunkedPrefill": {"enabled": False, "maxBatchedTokens": 8192}}),
    "chunked-off-budget-unset": changed({"runtime.chunkedPrefill": {"enabled": False}}),
    "selector-names-the-same-gpu": changed({"topology.unified": {
        "replicas": 2, "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}}),
    "selector-names-another-product-of-the-family": changed({"topology.unified": {
        "replicas": 2, "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-PCIe"}}}),
    "gpu-memory-of-the-largest-product": changed({"runtime.gpu": {"minMemoryGB": 94}}),
    "gpu-mig-memory-of-the-slice": changed(
        {"runtime.gpu": {"type": "A100", "mig": "3g.40gb", "minMemoryGB": 40}}),
    "gpu-mig-of-the-type": changed({"runtime.gpu": {"type": "H200", "mig": "1g.18gb"}}),
    "gpu-cloud-label-and-products": changed({"runtime.gpu": {
        "type": "H100", "count": 8, "nodeLabel": "cloud.google.com/gke-accelerator",
        "products": ["nvidia-h100-80gb"]}}),
    "gpu-products-with-mig": changed({"runtime.gpu": {
        "type": "A100", "products": ["NVIDIA-A100-SXM4-40GB"], "mig": "1g.5gb"}}),
    "whole-number-as-float": changed({"topology.unified": {"replicas": 2.0}}),
    # The default of replicas follows minReplicas (an older spec set only the bounds).
    "min-replicas-alone": changed({"topology.unified": {"minReplicas": 3, "maxReplicas": 5},
                                   "autoscaling": {"enabled": True, "gpuBudget": 12}}),
    "extra-args-repeat-a-field": changed({"runtime.maxNumSeqs": 64, "runtime.extraArgs": [
        "--max_num_seqs=064", "--enable-prefix-caching"]}),
    "extra-args-replace-defaults": changed({"runtime.extraArgs": [
        "-O3", "--enable-lora", "--max-loras", "4", "--kv-cache-dtype=auto", "--seed", "-1"]}),
    "extra-args-parallel-within-the-gpus": changed({"runtime.extraArgs": ["-tp", "2", "-dp", "2"]}),
    "extra-args-eager-both-ways": changed({"runtime.cudaGraphs": False,
                                           "runtime.extraArgs": ["--enforce-eager"]}),
    "selector-key-with-prefix": changed({"topology.unified": {"replicas": 2, "nodeSelector": {
        "node.kubernetes.io/instance-type": "p5.48xlarge", "topology.kubernetes.io/zone": "a"}}}),
    "selector-gpu-count-enough": changed({"topology.unified": {"replicas": 2, "nodeSelector": {
        "nvidia.com/gpu.count": "8", "nvidia.com/gpu.family": "hopper"}}}),
    "token-cap-below-context": changed({"model.maxModelLen": 4096,
                                        "traffic": {"limits": {"maxTokens": 4095}}}),
    "hf-source-of-the-model": changed({"model.source": "hf://meta-llama/Llama-3.1-8B-Instruct"}),
    "image-with-port-and-digest": changed(
        {"runtime.image": "localhost:5000/llmfleet/runtime:0.1@sha256:" + "a" * 64}),
    "env-at-the-size-limit": changed({"runtime.env": [
        {"name": "A", "value": "x" * 32_768}, {"name": "B", "value": "y" * 32_768}]}),
    "batched-tokens-equal-to-max-seqs": changed(
        {"runtime.maxNumSeqs": 256, "runtime.chunkedPrefill": {"maxBatchedTokens": 256}}),
    # Second round: just inside the new rules.
    "limits-alone-below-the-derived-requests": changed(
        {"runtime.resources": {"limits": {"cpu": "2", "memory": "16Gi"}}}),
    "limit-equal-to-request": changed(
        {"runtime.resources": {"requests": {"cpu": "500m"}, "limits": {"cpu": "0.5"}}}),
    "streamed-source-with-its-load-format": changed(
        {"model.source": "gs://models/llama-8b",
         "runtime.extraArgs": ["--load-format", "runai_streamer_sharded"]}),
    "kv-bytes-without-memory-share": changed(
        {"runtime.extraArgs": ["--kv-cache-memory-bytes=8589934592"]}),
    "revision-of-an-hf-source": changed(
        {"model.source": "hf://Qwen/Qwen2.5-7B-Instruct", "model.revision": "refs/pr/1"}),
    "pvc-source-with-dotted-names": changed({"model.source": "pvc://weights.v2/llama-3.1.8b/"}),
    "model-name-a-path-in-the-image": changed(
        {"model.name": "/opt/models/llama-3.1-8b", "runtime.image": "registry.local/llm:baked"}),
    "model-name-of-any-words-with-a-source": changed(
        {"model.name": "Llama 3.1 8B (ours)", "model.source": "pvc://weights/llama"}),
    "selector-node-label-of-a-product": changed({"runtime.gpu": {
        "nodeLabel": "cloud.google.com/gke-accelerator", "products": ["nvidia-h100-80gb"]},
        "topology.unified": {"replicas": 2, "nodeSelector": {
            "cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}}}),
    "selector-gpu-memory-of-a-product": changed({"topology.unified": {
        "replicas": 2, "nodeSelector": {"nvidia.com/gpu.memory": "95830"}}}),
    # Spares of a pool never scaled up still replace a lost serving pod at once (pools.assign).
    "spares-of-a-pool-with-fixed-bounds": changed({
        "topology.unified": {"replicas": 2, "minReplicas": 2, "maxReplicas": 2},
        "autoscaling": {"enabled": True, "warmSpares": 1}}),
    "extra-args-budget-and-seqs-within-the-fields": changed({
        "runtime.maxNumSeqs": 256, "model.maxModelLen": 8192,
        "runtime.chunkedPrefill": {"enabled": False},
        "runtime.extraArgs": ["--max-num-batched-tokens", "8192", "--seed=-1"]}),
    "analysis-ttft-limit-below-the-timeout": changed(
        {"traffic": {"limits": {"timeoutSeconds": 30}},
         "rollout": {"strategy": "Canary", "steps": [{"weight": 10}],
                     "analysis": {"maxTtftP95Ms": 29999}}}),
    "token-cap-below-the-extra-args-context": changed(
        {"runtime.extraArgs": ["--max-model-len=4096"],
         "traffic": {"limits": {"maxTokens": 4095}}}),
    "selector-mig-strategy-mixed-with-mig-slices": changed(
        {"runtime.gpu": {"type": "A100", "mig": "1g.5gb"}, "topology.unified": {
            "replicas": 2, "nodeSelector": {"nvidia.com/mig.strategy": "mixed"}}}),
    "selector-mig-strategy-single-with-whole-gpus": changed({"topology.unified": {
        "replicas": 2, "nodeSelector": {"nvidia.com/mig.strategy": "single"}}}),
    "extra-args-tensor-parallel-dividing": changed({"runtime.extraArgs": ["-tp", "4"]}),
    # Pipeline parallel within the GPUs: the tensor size follows (4 / 2), or is given.
    "extra-args-pipeline-over-all-the-gpus": changed({"runtime.extraArgs": ["-pp", "2"]}),
    "extra-args-pipeline-beside-tensor-parallel": changed(
        {"runtime.tensorParallel": 2, "runtime.extraArgs": ["--pipeline_parallel_size=2"]}),
    "extra-args-pipeline-with-data-parallel": changed(
        {"runtime.gpu.count": 8, "runtime.extraArgs": ["-tp", "2", "-pp", "2", "-dp", "2"]}),
    "extra-args-pipeline-with-replicas-left": changed(
        {"runtime.gpu.count": 8, "runtime.tensorParallel": 2, "runtime.extraArgs": ["-pp", "2"]}),
    # -tp x -dp without -pp at the edge: all the GPUs, or fewer when -dp is given.
    "extra-args-tensor-by-data-all-the-gpus": changed(
        {"runtime.gpu.count": 8, "runtime.extraArgs": ["-dp", "2", "--tensor_parallel_size=4"]}),
    "extra-args-tensor-by-data-leaving-gpus": changed(
        {"runtime.gpu.count": 8, "runtime.extraArgs": ["-tp", "2", "-dp", "3"]}),
    # A mode's options with their mode chosen, or at their defaults beside another mode.
    "rollout-canary-with-its-options": changed({"rollout": {
        "strategy": "Canary", "steps": [{"weight": 10}], "analysis": {"maxErrorRate": 0.05},
        "progressDeadlineSeconds": 600}}),
    "rollout-rolling-with-the-defaults-written": changed({"rollout": {
        "strategy": "RollingUpdate", "steps": [], "progressDeadlineSeconds": 1800}}),
    "debounce-options-with-latest-wins": changed(
        {"traffic": {"debounce": {"mode": "LatestWins", "windowMs": 1000, "delayMs": 0}}}),
    "debounce-off-with-the-defaults-written": changed(
        {"traffic": {"debounce": {"mode": "Off", "windowMs": 300, "delayMs": 5}}}),
    "cascade-window-of-min-window": changed({"traffic": {"cascade": {
        "tiers": [{"service": "small"}], "confidence": "MinWindowProbability",
        "windowTokens": 16}}}),
    "degradation-options-enabled": changed({"traffic": {"degradation": {
        "enabled": True, "service": "small", "maxQueueDepth": 8, "maxKvCacheUsage": 0.9}}}),
    "degradation-off-with-the-default-depth": changed(
        {"traffic": {"degradation": {"enabled": False, "maxQueueDepth": 4.0}}}),
    "scale-down-window-with-autoscaling": changed(
        {"autoscaling": {"enabled": True, "scaleDownStabilizationSeconds": 60}}),
    # Image names at the kubelet's limit, as it reads them.
    "image-name-at-the-limit": changed(
        {"runtime.image": "registry.example.com/" + "a" * 234 + ":v1"}),
    "image-hub-name-at-the-limit": changed({"runtime.image": "a" * 237 + ":v1"}),
    "image-legacy-hub-registry-at-the-limit": changed(
        {"runtime.image": "index.docker.io/org/" + "a" * 241}),
    "image-sha512-digest": changed({"runtime.image": "vllm/vllm-openai@sha512:" + "a" * 128}),
    "image-hex-name-with-a-tag": changed({"runtime.image": "0123456789abcdef" * 4 + ":v1"}),
    # The rollout annotations as llmfleet reads them, and other annotations of ours.
    "rollout-annotations": changed({"metadata.annotations": {
        "llmfleet.dev/rollout-pause": "false", "llmfleet.dev/rollout-promote": "1764230400",
        "llmfleet.dev/rollout-abort": "", "llmfleet.dev/rollout-retry": "again",
        "llmfleet.dev/owner": "team-a", "rollout-pause": "yes"}}),
    "rollout-paused": changed({"metadata.annotations": {"llmfleet.dev/rollout-pause": "true"}}),
    # Words kubectl reads as numbers unless quoted: they must reach the API server as strings.
    "extra-args-words-that-look-like-numbers": changed({"model.maxModelLen": 8192,
        "runtime.extraArgs": ["--max-model-len", "08192", "--tokenizer-revision", "4e3"]}),
    "eagle-head-of-the-model": changed({"runtime.speculative": {
        "method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}}),
}  # fmt: skip
"""Manifests just inside the rules: admission and `llmfleet validate` accept them."""


_TEXT = """apiVersion: llmfleet.dev/v1alpha1
kind: InferenceService
metadata:
  name: dialect
  labels: {LABELS}
spec:
  model:
    name: meta-llama/Llama-3.1-8B-Instruct
    {MODEL}
  runtime:
    prefixCaching: {PREFIX}
"""


def _text(model: str = "", prefix: str = "true", labels: str = "{}") -> str:
    return _TEXT.replace("{MODEL}", model).replace("{PREFIX}", prefix).replace("{LABELS}", labels)


YAML_DIALECT: dict[str, tuple[str, str | None]] = {
    "exponent-is-a-number": (_text("maxModelLen: 4e3"), None),
    "underscores-in-a-number": (_text("maxModelLen: 8_192"), None),
    "sexagesimal-is-a-string": (_text("revision: 3:00"), None),
    "a-date-is-a-string": (_text("revision: 2024-06-01"), None),
    "on-is-a-boolean": (_text(prefix="on"), None),
    "leading-zero-is-octal": (_text("revision: 0755"), "spec.model.revision"),
    "yes-is-no-name": (_text("servedName: yes"), "spec.model.servedName"),
    "off-is-no-label": (_text(labels="{canary: off}"), "metadata.labels"),
    # kubectl (v1.36) sends a key given twice without a word, the last one winning.
    "a-key-twice-is-not-refused": (_text("name: org/other"), None),
}
"""Manifests as people write them, whose scalars YAML 1.1 (PyYAML), YAML 1.2 and kubectl read
differently: id -> (text, None when the API server accepts it, else the field it names)."""
