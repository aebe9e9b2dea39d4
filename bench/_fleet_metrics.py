"""One stand-in exporter for every engine pod of the benchmark (bench/control_plane_scale.py,
issue 28): the series the autoscaler's PromQL reads, for thousands of pods, from one process.

The benchmark's pods are kwok pods: they have IPs but nothing answers on them, and a Prometheus
scraping 10,000 targets does not fit a 2-core machine. So one HTTP server on 127.0.0.1 serves, on
`/metrics`, vLLM-style series for every pod at once, each labelled as the local system's scrape
gives an engine's series (`layout.prometheus_config`, the pod runner's target labels): `namespace`,
`pod`, `llmfleet_dev_service`, `llmfleet_dev_pool`, and `instance` (the pod's IP and engine
port), which the autoscaler's query groups busy pods by. Prometheus scrapes this one target with
`honor_labels: true`, so these labels stay as they are.

Families: only those the autoscaler's query reads (`llmfleet.autoscaler.signals`): the gauges
`vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`; the counters
`vllm:request_success_total`, `vllm:prompt_tokens_total`, `vllm:num_preemptions_total`; the
request-size histograms' `_sum`/`_count` (`vllm:request_prompt_tokens`,
`vllm:request_generation_tokens`); and the latency histograms `vllm:time_to_first_token_seconds`,
`vllm:inter_token_latency_seconds` (the ITL fallback llm-d-inference-sim takes) and
`vllm:request_prefill_time_seconds`, their buckets only (the query reads no `_sum`/`_count` of
them) and fewer than vLLM's (`BOUNDS`). Every value is a
smooth function of the time since the exporter started and of the pod's index: counters grow at
a few requests per second per pod, so every rate is non-zero, and gauges move slowly.

    python bench/_fleet_metrics.py --pods PODS.json --port PORT

PODS.json: a list of {"namespace", "pod", "service", "pool", "ip"}.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ENGINE_PORT = 8000
PROMPT_TOKENS = 500.0
"""Mean prompt tokens per request."""
OUTPUT_TOKENS = 200.0
"""Mean output tokens per request (the ITL histogram counts token gaps)."""

BOUNDS: dict[str, tuple[tuple[float, float], ...]] = {
    # histogram -> (upper bound, share of observations at or below it), +Inf last
    "vllm:time_to_first_token_seconds": (
        (0.05, 0.2), (0.1, 0.5), (0.25, 0.8), (0.5, 0.93), (1.0, 0.98), (2.5, 0.995),
        (math.inf, 1.0),
    ),
    "vllm:inter_token_latency_seconds": (
        (0.01, 0.3), (0.025, 0.7), (0.05, 0.9), (0.1, 0.97), (0.25, 0.995), (math.inf, 1.0),
    ),
    "vllm:request_prefill_time_seconds": (
        (0.05, 0.3), (0.1, 0.6), (0.25, 0.85), (0.5, 0.95), (1.0, 0.99), (math.inf, 1.0),
    ),
}  # fmt: skip


@dataclass(frozen=True)
class Pod:
    namespace: str
    pod: str
    service: str
    pool: str
    ip: str

    def labels(self) -> str:
        """Its label set, without braces, as the autoscaler's query selects and groups it."""
        return (
            f'namespace="{self.namespace}",pod="{self.pod}",llmfleet_dev_service="{self.service}",'
            f'llmfleet_dev_pool="{self.pool}",instance="{self.ip}:{ENGINE_PORT}"'
        )


def _requests(index: int, t: float) -> float:
    """Requests the pod has finished after `t` seconds: 0.5-1.1 per second, with a wobble that
    never makes the count go down."""
    rate = 0.5 + (index % 7) * 0.1
    return rate * t + 0.2 * math.sin(t / 20 + index)


def exposition(pods: Sequence[Pod], t: float) -> str:
    """The text exposition (format 0.0.4) of every pod's series at `t` seconds (pure)."""
    labels = [pod.labels() for pod in pods]
    done = [max(_requests(i, t), 0.0) for i in range(len(pods))]
    lines: list[str] = []

    def family(name: str, kind: str, value: Callable[[int], float]) -> None:
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(f"{name}{{{labels[i]}}} {value(i):.3f}" for i in range(len(pods)))

    family("vllm:num_requests_running", "gauge",
           lambda i: float(round(4 + 3 * math.sin(t / 30 + i))))  # fmt: skip
    family("vllm:num_requests_waiting", "gauge",
           lambda i: float(max(0, round(2 * math.sin(t / 45 + i)))))  # fmt: skip
    family("vllm:kv_cache_usage_perc", "gauge", lambda i: 0.3 + 0.2 * math.sin(t / 60 + i))
    family("vllm:request_success_total", "counter", lambda i: done[i])
    family("vllm:prompt_tokens_total", "counter", lambda i: done[i] * PROMPT_TOKENS)
    family("vllm:num_preemptions_total", "counter", lambda i: done[i] * 0.01)
    for name, size in (("vllm:request_prompt_tokens", PROMPT_TOKENS),
                       ("vllm:request_generation_tokens", OUTPUT_TOKENS)):  # fmt: skip
        lines.append(f"# TYPE {name} histogram")
        lines.extend(f"{name}_sum{{{labels[i]}}} {done[i] * size:.3f}" for i in range(len(pods)))
        lines.extend(f"{name}_count{{{labels[i]}}} {done[i]:.3f}" for i in range(len(pods)))
    for name, bounds in BOUNDS.items():
        per_request = OUTPUT_TOKENS if name == "vllm:inter_token_latency_seconds" else 1.0
        lines.append(f"# TYPE {name} histogram")
        for bound, share in bounds:
            le = "+Inf" if bound == math.inf else f"{bound:g}"
            lines.extend(
                f'{name}_bucket{{{labels[i]},le="{le}"}} {done[i] * per_request * share:.3f}'
                for i in range(len(pods))
            )
    return "\n".join(lines) + "\n"


def read_pods(path: Path) -> list[Pod]:
    return [Pod(**entry) for entry in json.loads(path.read_text())]


def serve(pods: Sequence[Pod], port: int) -> None:
    started = time.monotonic()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return
            body = exposition(pods, time.monotonic() - started).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # one line per scrape says nothing

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    serve(read_pods(args.pods), args.port)


if __name__ == "__main__":
    main()
