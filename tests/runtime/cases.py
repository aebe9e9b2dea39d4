"""The argument builder's table: runtime config x GPU -> what the `vllm serve` line must hold.

Shared by the builder's own test and by the check against the real vLLM CLI fixture.
`expect` maps a flag to its value (None for a switch); `absent` lists flags that must not appear.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MODEL = {"name": "meta-llama/Llama-3.1-8B-Instruct"}


@dataclass(frozen=True)
class Case:
    id: str
    gpu: str
    """`TYPE:COUNT`, as LLMFLEET_RUNTIME_GPU takes it."""
    config: dict[str, Any]
    expect: dict[str, str | None] = field(default_factory=dict)
    absent: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)


def cfg(**parts: Any) -> dict[str, Any]:
    return {"model": MODEL, **parts}


CASES = [
    Case(
        "h100-unified-defaults",
        "H100:1",
        cfg(),
        expect={
            "--served-model-name": "meta-llama/Llama-3.1-8B-Instruct",
            "--host": "0.0.0.0",
            "--port": "8000",
            "--tensor-parallel-size": "1",
            "--kv-cache-dtype": "fp8",
            "--enable-prefix-caching": None,
            "--enable-chunked-prefill": None,
            "--max-num-batched-tokens": "8192",
            "--max-num-seqs": "256",
            "--gpu-memory-utilization": "0.9",
            "--optimization-level": "2",
            "--shutdown-timeout": "0",
        },
        absent=(
            "--kv-transfer-config",
            "--speculative-config",
            "--enforce-eager",
            "--data-parallel-size",
            "--disable-log-stats",
        ),
    ),
    Case(
        "h200-tp-from-gpu-count",
        "H200:4",
        cfg(),
        expect={
            "--tensor-parallel-size": "4",
            "--kv-cache-dtype": "fp8",
            "--max-num-batched-tokens": "8192",
        },
        absent=("--data-parallel-size",),
    ),
    Case(
        "b200-vllm-default-budget",
        "B200:2",
        cfg(),
        expect={
            "--tensor-parallel-size": "2",
            "--max-num-batched-tokens": "16384",
            "--kv-cache-dtype": "fp8",
        },
    ),
    Case(
        "a100-no-fp8-kv",
        "A100:1",
        cfg(),
        expect={"--kv-cache-dtype": "auto", "--max-num-batched-tokens": "2048"},
    ),
    Case(
        "l4-fp8-kv-on-ada",
        "L4:1",
        cfg(),
        expect={"--kv-cache-dtype": "fp8", "--max-num-batched-tokens": "2048"},
    ),
    Case(
        "h100-itl-slo-sizes-budget-and-seqs",
        "H100:1",
        cfg(slo={"ttftP95Ms": 500, "itlP95Ms": 50}),
        # 27k tok/s x 25 ms = 675 -> 512; (25 - 4.6) / 0.0462 + 1 = 442 sequences.
        expect={"--max-num-batched-tokens": "512", "--max-num-seqs": "442"},
    ),
    Case(
        "b200-tp2-itl-slo",
        "B200:2",
        cfg(slo={"itlP95Ms": 20}),
        # 27k x 2250/989 x 2 = 122.8k tok/s x 10 ms = 1228 -> 1024. Decode scale 3.35/8/2 =
        # 0.209: 0.96 ms at 1, 0.0097 per sequence -> 1 + (10 - 0.96) / 0.0097 = 935.
        expect={"--max-num-batched-tokens": "1024", "--max-num-seqs": "935"},
    ),
    Case(
        "l4-tight-itl-few-seqs",
        "L4:1",
        cfg(slo={"itlP95Ms": 100}),
        # decode scale 3.35/0.3 = 11.2: 51 ms at 1, 0.52 ms per sequence -> (50-51) < 0 -> 8.
        expect={"--max-num-seqs": "8", "--max-num-batched-tokens": "256"},
    ),
    Case(
        "h100-ttft-only-raises-budget",
        "H100:1",
        cfg(model={**MODEL, "maxModelLen": 131072}, slo={"ttftP95Ms": 1000}),
        # 8192 tokens take 303 ms per step; 131072 x 303 / 1000 = 39.8k -> 39936.
        expect={"--max-num-batched-tokens": "39936", "--max-model-len": "131072"},
    ),
    Case(
        "h100-prefill-role-nixl",
        "H100:2",
        cfg(role="prefill", kvTransfer={"connector": "NixlConnector"}, slo={"itlP95Ms": 30}),
        # A prefill pod decodes nothing: no ITL bound on its chunk, vLLM's H100 default.
        expect={
            "--kv-transfer-config": '{"kv_connector":"NixlConnector","kv_role":"kv_both"}',
            "--max-num-batched-tokens": "8192",
        },
        env={"VLLM_NIXL_SIDE_CHANNEL_PORT": "5600", "VLLM_NIXL_SIDE_CHANNEL_HOST": "10.0.0.7"},
    ),
    Case(
        "h200-decode-role-nixl-port",
        "H200:1",
        cfg(role="decode", kvTransfer={"connector": "NixlConnector", "sideChannelPort": 5601}),
        expect={"--kv-transfer-config": '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'},
        env={"VLLM_NIXL_SIDE_CHANNEL_PORT": "5601"},
    ),
    Case(
        "a100-prefill-lmcache",
        "A100:1",
        cfg(role="prefill", kvTransfer={"connector": "LMCacheConnectorV1"}),
        expect={
            "--kv-transfer-config": '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_producer"}'
        },
    ),
    Case(
        "b200-decode-lmcache",
        "B200:1",
        cfg(role="decode", kvTransfer={"connector": "LMCacheConnectorV1"}),
        expect={
            "--kv-transfer-config": '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_consumer"}'
        },
    ),
    Case(
        "h100-speculative-eagle3",
        "H100:1",
        cfg(
            runtime={
                "speculative": {
                    "method": "eagle3",
                    "model": "yuhuili/EAGLE3-LLaMA3.1-8B",
                    "numTokens": 3,
                }
            }
        ),
        expect={
            "--speculative-config": '{"method":"eagle3","num_speculative_tokens":3,'
            '"model":"yuhuili/EAGLE3-LLaMA3.1-8B"}'
        },
    ),
    Case(
        "l4-speculative-ngram",
        "L4:1",
        cfg(runtime={"speculative": {"method": "ngram", "numTokens": 4}}),
        expect={"--speculative-config": '{"method":"ngram","num_speculative_tokens":4}'},
    ),
    Case(
        "h100-fp8-quantized-tp2-of-4",
        "H100:4",
        cfg(
            runtime={
                "gpu": {"type": "H100", "count": 4},
                "tensorParallel": 2,
                "quantization": "fp8",
            }
        ),
        expect={
            "--quantization": "fp8",
            "--tensor-parallel-size": "2",
            "--data-parallel-size": "2",
        },
    ),
    Case(
        "a100-awq-spec-overrides",
        "A100:1",
        cfg(
            runtime={
                "quantization": "awq",
                "kvCacheDtype": "fp8_e5m2",
                "prefixCaching": False,
                "cudaGraphs": False,
                "maxNumSeqs": 64,
                "gpuMemoryUtilization": 0.85,
                "chunkedPrefill": {"maxBatchedTokens": 4096},
            }
        ),
        expect={
            "--quantization": "awq",
            "--kv-cache-dtype": "fp8_e5m2",
            "--disable-prefix-caching": None,
            "--enforce-eager": None,
            "--max-num-seqs": "64",
            "--gpu-memory-utilization": "0.85",
            "--max-num-batched-tokens": "4096",
        },
        absent=("--enable-prefix-caching", "--optimization-level"),
    ),
    Case(
        "h100-chunked-prefill-off",
        "H100:1",
        cfg(runtime={"chunkedPrefill": {"enabled": False}}),
        expect={"--disable-chunked-prefill": None},
        absent=("--enable-chunked-prefill", "--max-num-batched-tokens"),
    ),
    Case(
        "h100-extra-args-replace-defaults",
        "H100:1",
        cfg(
            runtime={
                "extraArgs": [
                    "--max-num-seqs",
                    "128",
                    "--kv-cache-dtype=auto",
                    "-O3",
                    "--enable-lora",
                    "--max-loras",
                    "4",
                ]
            }
        ),
        expect={
            "--max-num-seqs": "128",
            "--kv-cache-dtype": "auto",
            "--optimization-level": "3",
            "--enable-lora": None,
            "--max-loras": "4",
        },
    ),
    Case(
        "h200-extra-args-eager-replaces-graph-default",
        "H200:1",
        cfg(runtime={"extraArgs": ["--enforce-eager", "--max_num_batched_tokens", "2048"]}),
        expect={"--enforce-eager": None, "--max-num-batched-tokens": "2048"},
        absent=("--optimization-level",),
    ),
    Case(
        "h100-default-sequences-follow-a-small-step-budget",
        "H100:1",
        cfg(runtime={"chunkedPrefill": {"maxBatchedTokens": 128}}),
        expect={"--max-num-seqs": "128", "--max-num-batched-tokens": "128"},
    ),
    Case(
        "l4-extra-args-agree-with-spec",
        "L4:1",
        cfg(runtime={"maxNumSeqs": 32, "extraArgs": ["--max-num-seqs", "32"]}),
        expect={"--max-num-seqs": "32"},
    ),
    Case(
        "h100-served-name-revision-env",
        "H100:1",
        cfg(
            model={**MODEL, "servedName": "llama-8b", "revision": "main"},
            runtime={"env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]},
            serving={"port": 9001, "host": "127.0.0.1", "drainGraceSeconds": 45},
        ),
        expect={
            "--served-model-name": "llama-8b",
            "--revision": "main",
            "--port": "9001",
            "--host": "127.0.0.1",
            "--shutdown-timeout": "0",
        },
        env={"VLLM_LOGGING_LEVEL": "DEBUG"},
    ),
    # A CPU engine (vLLM's CPU build): KV cache in bytes of host memory instead of a GPU
    # fraction, eager mode (no CUDA graphs), vLLM's CPU batching defaults, block size left to
    # the engine (128 on CPU, vllm-facts.md).
    Case(
        "cpu-defaults",
        "CPU:1",
        cfg(),
        expect={
            "--kv-cache-memory-bytes": str(2**30),
            "--enforce-eager": None,
            "--kv-cache-dtype": "auto",
            "--max-num-seqs": "128",
            "--max-num-batched-tokens": "2048",
            "--tensor-parallel-size": "1",
            "--enable-prefix-caching": None,
        },
        absent=("--gpu-memory-utilization", "--optimization-level", "--block-size"),
    ),
    Case(
        # The InferenceService's default, always rendered by the operator: eager all the same.
        "cpu-cuda-graphs-true-is-moot",
        "CPU:1",
        cfg(runtime={"cudaGraphs": True}),
        expect={"--enforce-eager": None},
        absent=("--optimization-level",),
    ),
    Case(
        "cpu-slo-targets-leave-cpu-defaults",
        "CPU:1",
        cfg(slo={"itlP95Ms": 50, "ttftP95Ms": 500}, model={**MODEL, "maxModelLen": 4096}),
        expect={"--max-num-seqs": "128", "--max-num-batched-tokens": "2048"},
    ),
    Case(
        "cpu-spec-and-extra-args-replace-cpu-defaults",
        "CPU:1",
        cfg(
            runtime={
                "maxNumSeqs": 4,
                "cudaGraphs": False,
                "extraArgs": ["--kv-cache-memory-bytes", "268435456"],
            }
        ),
        expect={
            "--max-num-seqs": "4",
            "--enforce-eager": None,
            "--kv-cache-memory-bytes": "268435456",
            "--max-num-batched-tokens": "2048",
        },
    ),
    # extraArgs' -tp: the GPUs one engine leaves serve as data-parallel replicas.
    Case(
        "h100-extra-args-tensor-parallel-replicas",
        "H100:8",
        cfg(runtime={"gpu": {"type": "H100", "count": 8}, "extraArgs": ["-tp", "2"]}),
        expect={"--tensor-parallel-size": "2", "--data-parallel-size": "4"},
    ),
    Case(
        "h100-extra-args-tensor-and-pipeline-replicas",
        "H100:8",
        cfg(runtime={"gpu": {"type": "H100", "count": 8}, "extraArgs": ["-tp", "1", "-pp", "2"]}),
        expect={
            "--tensor-parallel-size": "1",
            "--pipeline-parallel-size": "2",
            "--data-parallel-size": "4",
        },
    ),
    # extraArgs' -pp: the tensor-parallel default follows (one engine over all the GPUs).
    Case(
        "h100-pipeline-tensor-default-follows",
        "H100:4",
        cfg(runtime={"gpu": {"type": "H100", "count": 4}, "extraArgs": ["-pp", "2"]}),
        expect={"--tensor-parallel-size": "2", "--pipeline-parallel-size": "2"},
        absent=("--data-parallel-size",),
    ),
    # ... and the data-parallel default counts the engines tensor x pipeline GPUs leave room for.
    Case(
        "h100-pipeline-beside-tensor-parallel-replicas",
        "H100:8",
        cfg(
            runtime={
                "gpu": {"type": "H100", "count": 8},
                "tensorParallel": 2,
                "extraArgs": ["--pipeline_parallel_size=2"],
            }
        ),
        expect={
            "--tensor-parallel-size": "2",
            "--pipeline-parallel-size": "2",
            "--data-parallel-size": "2",
        },
    ),
]
