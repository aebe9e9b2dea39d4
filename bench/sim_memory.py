"""The local engine's memory against the requests it served: llm-d-inference-sim with the flags
local/engines.py gives it, beside the same engine with the simulator's default waiting queue
(1000, what engines.py passed before issue 26) and without KV-cache simulation.

    .venv/bin/llmfleet isolated -- nice .venv/bin/python bench/sim_memory.py \
        > bench/results/sim-memory.txt

Each variant is a fresh simulator on 127.0.0.1 (POD_IP=127.0.0.1, as KV-cache simulation needs
one) with `GODEBUG=gctrace=1`, so its log says the Go heap after each collection. A few client
threads send `--requests` requests, one in two with a distinct prompt of 100-1500 words and one
in two behind a shared 1500-word prefix, alternating completions and chat, streamed and not,
16 output tokens each. Latencies are zeroed (`--inter-token-latency=0ms`, ...): the memory
depends on what each request allocates, not on how long it takes. Every tenth of the run prints
the resident set (VmRSS), and the end prints the peak (VmHWM) and the last collection's heap:
live after it and the goal of the next (Go collects when the heap reaches twice the live heap).
The bounded variants then ask for long answers until every slot of the per-token metric ring
(below) was written twice, the worst case: all of its pages resident.

The simulator's per-token metric ring, 8 bytes x (seqs + waiting) x max-model-len, is live heap
from the start, untouched: with the default queue it makes the goal ~520 MB, so each request's
garbage lands on fresh pages until the resident set is ~300 MB. The KV cache is not the cause
(the same without it). `GOMEMLIMIT` alone is no fix: the untouched ring counts against it, so
below the ring the collector runs all the time (thousands of collections, the run several times
slower); with the queue bounded the engine's goal stays under the limit the image's shim sets.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from _support import free_port, wait_ready

from llmfleet.core import netns
from llmfleet.core.cluster import build
from llmfleet.core.cluster.toolchain import TOOLS_BY_NAME
from llmfleet.core.local import engines
from llmfleet.core.vllm_shim import KV_CACHE_FLAGS

MODEL = "sim-memory"
OUTPUT_TOKENS = 16
ZERO_LATENCY = [
    "--startup-duration=0s",
    "--prefill-overhead=0ms",
    "--prefill-time-per-token=0ms",
    "--inter-token-latency=0ms",
]
GC_LINE = re.compile(r"(\d+)->(\d+)->(\d+) MB, (\d+) MB goal")
RING_PASSES = 2
"""How often `write_ring` goes round the ring: after the first pass every page is in RAM, the
second shows that the resident set then stays."""
WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa")


@dataclass(frozen=True)
class Variant:
    name: str
    extra: tuple[str, ...] = ()
    kv_cache: bool = True
    env: tuple[tuple[str, str], ...] = ()
    write_ring: bool = False
    """Then write every slot of the per-token metric ring `RING_PASSES` times (the worst case: all
    its pages in RAM; only for the bounded ring, 8.4M tokens a pass, seconds here)."""

    def argv(self, binary: str, port: int) -> list[str]:
        config = {"role": "unified", "port": port, "model": {"name": MODEL}}
        argv = engines.engine_argv(binary, config, {}) + ZERO_LATENCY + list(self.extra)
        if not self.kv_cache:
            argv = [word for word in argv if not word.startswith(KV_CACHE_FLAGS)]
        return argv


DEFAULT_QUEUE = ("--max-waiting-queue-length=1000",)
SHIM_LIMIT = (("GOMEMLIMIT", str(384 * 2**20 // 2)),)
"""What the engine-local image's shim sets in a container limited to 384Mi (vllm_shim.py)."""
VARIANTS = (
    Variant("engines.py (bounded waiting queue)", write_ring=True),
    Variant("default waiting queue (1000), before", DEFAULT_QUEUE),
    Variant("default waiting queue, no KV cache", DEFAULT_QUEUE, kv_cache=False),
    Variant(
        "default waiting queue, GOMEMLIMIT of a 384Mi container", DEFAULT_QUEUE, env=SHIM_LIMIT
    ),
    Variant(
        "engines.py, GOMEMLIMIT of a 384Mi container (the image)", env=SHIM_LIMIT, write_ring=True
    ),
)


def _status(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) // 1024
    return 0


def _request(index: int, rnd: random.Random, prefix: str) -> tuple[str, dict[str, object]]:
    text = " ".join(f"w{rnd.randrange(10**6)}" for _ in range(rnd.randint(100, 1500)))
    if index % 2:
        text = f"{prefix} {text[:200]}"
    stream = (index // 2) % 2 == 1
    common = {"model": MODEL, "max_tokens": OUTPUT_TOKENS, "stream": stream}
    if (index // 4) % 2:
        return "/v1/chat/completions", {**common, "messages": [{"role": "user", "content": text}]}
    return "/v1/completions", {**common, "prompt": text}


def _drive(base: str, total: int, threads: int, report: list[tuple[int, int]], pid: int) -> int:
    """Send `total` requests from `threads` threads; note (served, RSS MiB) every tenth."""
    counter = itertools.count()
    prefix = " ".join(random.Random(1).choice(WORDS) for _ in range(1500))
    failures = [0]
    step = max(1, total // 10)

    def worker(seed: int) -> None:
        rnd = random.Random(seed)
        with httpx.Client(base_url=base, timeout=60) as client:
            while (index := next(counter)) < total:
                path, body = _request(index, rnd, prefix)
                try:
                    with client.stream("POST", path, json=body) as response:
                        for _ in response.iter_bytes():
                            pass
                        ok = response.status_code == 200
                except httpx.HTTPError:
                    ok = False
                failures[0] += not ok
                if (index + 1) % step == 0:
                    report.append((index + 1, _status(pid, "VmRSS")))

    pool = [threading.Thread(target=worker, args=(seed,)) for seed in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return failures[0]


def _write_ring(base: str, tokens: int) -> tuple[int, float]:
    """Ask for long answers, one at a time, until `tokens` tokens were generated: every slot of
    the per-token metric ring has then been written once. Returns (tokens, seconds)."""
    body = {"model": MODEL, "prompt": "hi", "max_tokens": engines.DEFAULT_MAX_MODEL_LEN - 64}
    written, began = 0, time.monotonic()
    with httpx.Client(base_url=base, timeout=120) as client:
        while written < tokens:
            response = client.post("/v1/completions", json=body)
            response.raise_for_status()
            written += int(response.json()["usage"]["completion_tokens"])
    return written, time.monotonic() - began


def run(variant: Variant, binary: str, total: int, threads: int) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    argv = variant.argv(binary, port)
    waiting = next(w for w in argv[::-1] if w.startswith("--max-waiting-queue-length="))
    slots = (engines.DEFAULT_MAX_NUM_SEQS + int(waiting.split("=", 1)[1])) * (
        engines.DEFAULT_MAX_MODEL_LEN
    )
    env = {**os.environ, "POD_IP": "127.0.0.1", "GODEBUG": "gctrace=1", **dict(variant.env)}
    with tempfile.NamedTemporaryFile("w+", suffix=".log") as log:
        process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_ready(f"{base}/health/ready")
            start = _status(process.pid, "VmRSS")
            report: list[tuple[int, int]] = []
            began = time.monotonic()
            failed = _drive(base, total, threads, report, process.pid)
            seconds = time.monotonic() - began
            peak = _status(process.pid, "VmHWM")
            written = _write_ring(base, RING_PASSES * slots) if variant.write_ring else None
            after = (_status(process.pid, "VmRSS"), _status(process.pid, "VmHWM"))
        finally:
            process.terminate()
            process.wait(timeout=30)
        collections = GC_LINE.findall(Path(log.name).read_text())
    print(f"## {variant.name}")
    kv_cache = "" if variant.kv_cache else ", without its KV-cache flags"
    print(f"   engines.py's flags{kv_cache}, then: {' '.join(ZERO_LATENCY + list(variant.extra))}")
    if variant.env:
        print(f"   environment: {' '.join(f'{key}={value}' for key, value in variant.env)}")
    ring = engines.TPOT_SLOT_BYTES * slots / 2**20
    print(f"   {waiting}: per-token metric ring {ring:.0f} MiB (untouched at start)")
    print(f"   {total} requests in {seconds:.0f} s, {failed} failed; RSS at start {start} MiB")
    print("   served: " + " ".join(f"{served:>6}" for served, _ in sorted(report)))
    print("   RSS MiB:" + " ".join(f"{rss:>6}" for _, rss in sorted(report)))
    print(f"   peak RSS {peak} MiB")
    if written is not None:
        tokens, took = written
        passes = f"{RING_PASSES}x ({tokens / 1e6:.1f}M tokens, long answers, {took:.0f} s)"
        print(f"   then the ring written {passes}: RSS {after[0]} MiB, peak {after[1]} MiB")
    if collections:
        _, _, live, goal = collections[-1]
        print(f"   last GC ({len(collections)} in all): live heap {live} MB, next goal {goal} MB")
    print(flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--threads", type=int, default=6)
    parser.add_argument("--only", help="run the variants whose name holds this text")
    args = parser.parse_args()
    problem = netns.isolation_problem()
    if problem:
        raise SystemExit(f"sim_memory: {problem}")
    tool = TOOLS_BY_NAME["llm-d-inference-sim"]
    binary = build.binary(tool, "llm-d-inference-sim")
    if not binary.exists():
        raise SystemExit(f"{binary} missing: run `llmfleet cluster build`")
    python = sys.version.split()[0]
    print(
        f"llm-d-inference-sim {tool.version}, {args.requests} requests per variant from "
        f"{args.threads} threads, {OUTPUT_TOKENS} output tokens each; Python {python}"
    )
    print()
    for variant in VARIANTS:
        if args.only and args.only not in variant.name:
            continue
        run(variant, str(binary), args.requests, args.threads)


if __name__ == "__main__":
    main()
