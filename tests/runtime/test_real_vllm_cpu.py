"""The metric contract against a real vLLM: the launcher starts vLLM's CPU build (`llmfleet images
vllm-cpu`, which `make test` runs first) on the tiny model, a few requests go through it, and
every vLLM metric family and label llmfleet reads is looked up in the engine's own `/metrics`,
not in a hand-made fixture; the fixture (tests/chart/metrics/vllm.txt) must list every family
the real engine declares.

One engine at a time, one module: ~3.5 GB of memory and ~1 min to start on 2 cores.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from llmfleet.core import vllm_metrics
from llmfleet.core.images import vllm_cpu
from llmfleet.core.images.builder import source_root
from llmfleet.gateway.endpoints import EngineLoad
from llmfleet.gateway.scraper import engine_load
from llmfleet.runtime import metrics as launcher_metrics
from tests.net import free_port, status, wait_for
from tests.runtime.processes import LAUNCHER, REPO, stop

pytestmark = pytest.mark.vllm_cpu

SERVED = "tiny"
READY_SECONDS = 600
"""Deadline for the engine's start and warm-up (~50 s alone on 2 cores; CI shares them)."""
TOKEN_BYTES = 2048
"""KV cache a token takes in the tiny model: 2 layers x K and V x 256 wide x 2 bytes (bf16)."""
KV_CACHE_BYTES = 8 * 2**20
"""4096 tokens, 32 blocks of 128: two full-length (maxModelLen 2048) sequences."""
BURST = 8
"""Concurrent generations of BURST_TOKENS each. Any three of them running at once outgrow the
cache (3 x 12 blocks > 32): 8 x 700 tokens preempted only when most overlapped, and in one run
of three none did."""
BURST_TOKENS = 1500
BUSY_READ_SECONDS = 3.0
"""How long a read of /metrics during a burst waits for its answer (CI saw the engine's API
server answer a read sent as a burst started only after the burst, ~27 s later)."""
DRAIN_TOKENS = 300
"""A stream long enough (several seconds here) to be in flight when the drain begins."""
WARMUP_REQUESTS = 2
"""The launcher's warm-up (the config's default: 2 requests, no system prompts)."""
LABELS = frozenset({"model_name", "engine"})
"""What every vLLM series llmfleet reads carries (runtime/metrics.py sums one sample per label
set), except `cache_config_info`, which has `engine` but no `model_name`."""


@dataclass(frozen=True)
class Read:
    family: str
    """As declared in `# TYPE` (a counter without `_total`)."""
    kind: str
    where: str
    """Where llmfleet reads it."""
    labels: frozenset[str] = LABELS
    """Labels every sample carries (and `le` on every histogram bucket, which PromQL reads)."""


READ = (
    Read("vllm:num_requests_running", "gauge", "gateway routing/scraper, autoscaler signals, "
         "launcher drain, operator drain probe, recording rules, dashboards"),
    Read("vllm:num_requests_waiting", "gauge", "gateway routing/saturation/scraper, autoscaler "
         "signals, profiler, recording rules"),
    Read("vllm:kv_cache_usage_perc", "gauge", "gateway routing (kv_cache, saturation), "
         "autoscaler signals, recording rules"),
    Read("vllm:cache_config_info", "gauge", "launcher metrics (KV capacity), capacity profile",
         frozenset({"engine", "num_gpu_blocks", "block_size"})),
    Read("vllm:request_success", "counter", "autoscaler request_rate, recording rules"),
    Read("vllm:prompt_tokens", "counter", "autoscaler prompt_tokens_rate, recording rules"),
    Read("vllm:generation_tokens", "counter", "recording rules"),
    Read("vllm:num_preemptions", "counter", "autoscaler preemption_rate, profiler, alert and "
         "recording rules"),
    Read("vllm:time_to_first_token_seconds", "histogram", "autoscaler ttft, canary analysis, "
         "recording rules"),
    Read("vllm:inter_token_latency_seconds", "histogram", "autoscaler itl, canary analysis, "
         "recording rules"),
    Read("vllm:request_time_per_output_token_seconds", "histogram", "autoscaler ITL goodput"),
    Read("vllm:request_prefill_time_seconds", "histogram", "autoscaler prefill goodput"),
    Read("vllm:request_prompt_tokens", "histogram", "autoscaler mean_prompt_tokens"),
    Read("vllm:request_generation_tokens", "histogram", "autoscaler mean_output_tokens"),
)  # fmt: skip
FALLBACKS = (
    ("vllm:gpu_cache_usage_perc", "gateway scraper/endpoints: kv_cache_usage_perc before 0.9"),
    ("vllm:time_per_output_token_seconds", "autoscaler, canary analysis, recording rules: "
     "inter_token_latency_seconds before 0.11"),
)  # fmt: skip
"""Older names llmfleet still reads for older engines (and llm-d-inference-sim): the real
engine no longer exports them."""


@dataclass(frozen=True)
class Engine:
    url: str
    side: str
    process: subprocess.Popen[bytes]
    log: Path


def _tree_rss_bytes(pid: int) -> int:
    """Resident memory of `pid` and its descendants (vLLM runs its engine core apart)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        child = int(stat.parent.name)
        children.setdefault(int(fields[1]), []).append(child)
        rss[child] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        total += rss.get(current, 0)
        todo += children.get(current, [])
    return total


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    built = vllm_cpu.built(source_root())
    if built is None:
        pytest.fail("vLLM's CPU build is not built: run `llmfleet images vllm-cpu` (make test "
                    "does)", pytrace=False)  # fmt: skip
    folder = tmp_path_factory.mktemp("vllm-cpu")
    port, side_port = free_port(), free_port()
    config = {
        "model": {"name": str(built.model), "servedName": SERVED, "maxModelLen": 2048},
        # A KV cache of KV_CACHE_BYTES, replacing the launcher's CPU default, small enough that
        # a burst of long generations preempts.
        "runtime": {"extraArgs": ["--kv-cache-memory-bytes", str(KV_CACHE_BYTES)]},
        "serving": {"port": port, "launcherPort": side_port, "host": "127.0.0.1",
                    "startupTimeoutSeconds": READY_SECONDS, "drainGraceSeconds": 120},
    }  # fmt: skip
    path = folder / "runtime.json"
    path.write_text(json.dumps(config))
    log = folder / "launcher.log"
    started = time.monotonic()
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [LAUNCHER, "serve", "--config", path],
            stdout=sink,
            stderr=subprocess.STDOUT,
            # As the local sample's pods run it (core/local/samples/vllm-cpu.yaml): one OpenMP
            # thread, unbound. vLLM's default binds a thread to every core, and on 2 cores its
            # busy engine left the API server's /metrics unanswered for whole bursts (CI).
            env={**built.env(), "OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"},
            cwd=REPO,
        )
    found = Engine(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{side_port}", process, log)
    try:
        wait_for(
            lambda: True if status(f"{found.side}/ready") == 200 else _exited(found),
            READY_SECONDS,
            "the CPU vLLM's readiness",
            every=1,
        )
        print(f"\nvllm-cpu: ready in {time.monotonic() - started:.0f}s")
        # Readiness came after the warm-up, which the real engine served (and nothing else yet).
        text = httpx.get(f"{found.url}/metrics", timeout=30).text
        served = vllm_metrics.read(text, ["vllm:request_success_total"])
        assert vllm_metrics.total(served["vllm:request_success_total"]) == WARMUP_REQUESTS
        yield found
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                stop(process)


def _exited(engine: Engine) -> None:
    if engine.process.poll() is not None:
        tail = engine.log.read_text()[-3000:]
        raise AssertionError(f"the launcher exited {engine.process.returncode}:\n{tail}")


@pytest.fixture(scope="module")
def dump(engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> str:
    """`/metrics` after completions (a shared prefix, so the prefix cache hits), a chat and a
    streamed chat."""
    prefix = "You are a terse assistant. Answer in one word. " * 8
    with httpx.Client(base_url=engine.url, timeout=120) as client:
        for question in ("one", "two", "three"):
            body = {"model": SERVED, "prompt": prefix + question, "max_tokens": 8}
            assert client.post("/v1/completions", json=body).status_code == 200
        chat = {"model": SERVED, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
        answer = client.post("/v1/chat/completions", json=chat)
        assert answer.status_code == 200
        assert answer.json()["choices"][0]["message"]["content"]
        with client.stream("POST", "/v1/chat/completions", json=chat | {"stream": True}) as sse:
            events = [line for line in sse.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        assert len(events) > 2
        text = client.get("/metrics").text
    print(f"vllm-cpu: memory {_tree_rss_bytes(engine.process.pid) / 2**30:.1f} GiB")
    saved = tmp_path_factory.mktemp("dump") / "metrics.txt"
    saved.write_text(text)
    print(f"vllm-cpu: /metrics dump in {saved}")
    return text


def _declared(text: str) -> dict[str, str]:
    """`# TYPE` lines of the `vllm:` families: name -> type, a counter by its name without
    `_total`. NOTE: the prometheus_client vLLM 0.32 runs (0.26) declares a counter with its
    `_total` name, and each counter's and histogram's `_created` series as a gauge family of its
    own (not read by llmfleet, left out here)."""
    declared = {}
    for name, kind in re.findall(r"^# TYPE (vllm:\S+) (\S+)$", text, re.MULTILINE):
        if kind == "gauge" and name.endswith("_created"):
            continue
        declared[name.removesuffix("_total") if kind == "counter" else name] = kind
    return declared


def _series(read: Read) -> list[str]:
    if read.kind == "counter":
        return [f"{read.family}_total"]
    if read.kind == "histogram":
        return [f"{read.family}_{part}" for part in ("bucket", "sum", "count")]
    return [read.family]


@pytest.mark.parametrize("read", READ, ids=[read.family for read in READ])
def test_every_family_llmfleet_reads_is_exported_with_its_labels(dump: str, read: Read) -> None:
    assert _declared(dump).get(read.family) == read.kind, f"{read.family} ({read.where})"
    found = vllm_metrics.read(dump, _series(read))
    for name, samples in found.items():
        assert samples, f"{name} has no samples ({read.where})"
        for sample in samples:
            labels = set(sample.labels())
            wanted = read.labels | ({"le"} if name.endswith("_bucket") else set())
            assert wanted <= labels, f"{name}: {sorted(wanted - labels)} missing"


@pytest.mark.parametrize(("family", "where"), FALLBACKS, ids=[f for f, _ in FALLBACKS])
def test_fallback_names_are_gone_from_the_real_engine(dump: str, family: str, where: str) -> None:
    assert family not in _declared(dump), f"{family} is exported again: {where}"


def test_the_counters_moved_with_the_requests(dump: str) -> None:
    """The requests above show in the series llmfleet reads (not only declared, counting)."""
    found = vllm_metrics.read(dump, [
        "vllm:request_success_total", "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_count",
        "vllm:prefix_cache_hits_total",
    ])  # fmt: skip
    # Five requests here and the launcher's warm-up before them.
    assert vllm_metrics.total(found["vllm:request_success_total"]) >= 5
    assert vllm_metrics.total(found["vllm:time_to_first_token_seconds_count"]) >= 5
    assert vllm_metrics.total(found["vllm:prompt_tokens_total"]) > 0
    assert vllm_metrics.total(found["vllm:generation_tokens_total"]) >= 5
    assert vllm_metrics.total(found["vllm:prefix_cache_hits_total"]) > 0
    reasons = {s.labels()["finished_reason"] for s in found["vllm:request_success_total"]}
    assert "length" in reasons


def test_the_launcher_reads_the_kv_capacity_the_engine_chose(dump: str) -> None:
    """Block size comes from the engine (128 on vLLM's CPU build, 16 on GPUs), never assumed;
    the capacity is what extraArgs' --kv-cache-memory-bytes asked for."""
    (info,) = vllm_metrics.read(dump, [vllm_metrics.CACHE_CONFIG_INFO])[
        vllm_metrics.CACHE_CONFIG_INFO
    ]
    labels = info.labels()
    assert labels["block_size"] == "128"
    assert labels["kv_cache_memory_bytes"] == str(KV_CACHE_BYTES)
    assert launcher_metrics.kv_cache_tokens(dump) == KV_CACHE_BYTES // TOKEN_BYTES


def test_a_kv_cache_too_small_for_the_batch_preempts(engine: Engine, dump: str) -> None:
    """What the LLMFleetPreemptionsRising alert watches moves on a real engine: a burst of long
    generations outgrows the KV cache, and vLLM preempts (evicts and recomputes)."""
    before = _preemptions(dump)
    body = {"model": SERVED, "prompt": "Tell a long story.", "max_tokens": BURST_TOKENS,
            "ignore_eos": True}  # fmt: skip

    def one(_: int) -> int:
        with httpx.Client(base_url=engine.url, timeout=300) as client:
            return client.post("/v1/completions", json=body).json()["usage"]["completion_tokens"]

    def burst() -> tuple[EngineLoad, int] | None:
        """One burst; what /metrics showed while it ran (None: it ended between two reads)."""
        seen = None
        with ThreadPoolExecutor(BURST) as pool:
            futures = [pool.submit(one, n) for n in range(BURST)]
            # Meanwhile the gateway's scraper and the launcher's drain read the batch off
            # /metrics, until the burst ends.
            while seen is None and not all(future.done() for future in futures):
                seen = _busy(engine)
                time.sleep(0.2)
            generated = [future.result() for future in futures]
        assert generated == [BURST_TOKENS] * BURST
        return seen

    # On an idle machine a burst can end between two reads, and on a busy one the engine's API
    # server can leave /metrics unanswered for most of a burst (a read then gives up after
    # `BUSY_READ_SECONDS` and the next one is sent): at most five bursts.
    seen = None
    for _ in range(5):
        if (seen := burst()) is not None:
            break
    assert seen is not None, "five bursts each ended before /metrics showed it running"
    load, in_engine = seen
    assert load.running + load.waiting == in_engine > 0
    assert 0 < load.kv_usage <= 1

    def preempted() -> float | None:
        count = _preemptions(httpx.get(f"{engine.url}/metrics", timeout=30).text)
        return count if count > before else None

    # The counter is read with a deadline, never once; a burst whose requests did not overlap
    # enough to fill the cache (a busy machine staggers them) is followed by another, at most 3.
    after, bursts = preempted(), 1
    while after is None and bursts < 3:
        with contextlib.suppress(AssertionError):
            after = wait_for(preempted, 10, "the preemption counter to rise")
        if after is None:
            burst()
            bursts += 1
    if after is None:
        after = wait_for(preempted, 10, f"a preemption within {bursts} bursts of {BURST}")
    print(f"vllm-cpu: {after - before:g} preemptions in {bursts} burst(s) of {BURST}")
    assert after > before


def _busy(engine: Engine) -> tuple[EngineLoad, int] | None:
    """What the gateway's scraper and the launcher read off /metrics while a burst runs (None
    until it shows a running batch in the KV cache)."""
    try:
        text = httpx.get(f"{engine.url}/metrics", timeout=BUSY_READ_SECONDS).text
    except httpx.TimeoutException:
        return None  # not answered in time: read again (the burst may be over by the answer)
    load, in_engine = engine_load(text), launcher_metrics.requests_in_engine(text)
    return (load, in_engine) if load.running and load.kv_usage and in_engine else None


def _preemptions(text: str) -> float:
    samples = vllm_metrics.read(text, ["vllm:num_preemptions_total"])["vllm:num_preemptions_total"]
    found = vllm_metrics.total(samples)
    assert found is not None
    return found


def test_every_family_the_real_engine_declares_is_in_the_fixture(dump: str) -> None:
    fixture = (REPO / "tests" / "chart" / "metrics" / "vllm.txt").read_text()
    listed = dict(re.findall(r"^(vllm:\S+) (\S+)$", fixture, re.MULTILINE))
    declared = _declared(dump)
    missing = {name: kind for name, kind in declared.items() if listed.get(name) != kind}
    assert not missing, f"the real engine declares what the fixture lacks: {missing}"


def test_the_drain_lets_an_in_flight_stream_finish(engine: Engine) -> None:
    """Last: the preStop hook's drain during a stream turns readiness off at once and answers
    once the stream has ended, whole; SIGTERM then stops the engine and the launcher exits 0."""
    body = {"model": SERVED, "prompt": "Go on.", "max_tokens": DRAIN_TOKENS, "ignore_eos": True,
            "stream": True}  # fmt: skip
    with httpx.Client(base_url=engine.url, timeout=120) as client, ThreadPoolExecutor(1) as pool:
        with client.stream("POST", "/v1/completions", json=body) as stream:
            lines = stream.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            drain = pool.submit(httpx.get, f"{engine.side}/drain", timeout=120)
            wait_for(lambda: status(f"{engine.side}/ready") == 503 or None, 30, "not ready")
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        chunks = [json.loads(line.removeprefix("data: ")) for line in [first, *rest[:-1]]]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert drain.result().status_code == 200
    engine.process.send_signal(signal.SIGTERM)
    assert engine.process.wait(timeout=60) == 0
