"""Real vLLM behind engine pods (issue 31): vLLM's CPU build in containers of the real node.

The session's system (`llmfleet up --real-node`) gets the service `llmfleet up --engine
vllm-cpu` adds, installed the same way (core/local/vllm_engine.py: the cache's build on a
PersistentVolumeClaim, the local engine image's `vllm` running it), sized for this module: two
engines, each with a KV cache of 8 MiB (4,096 tokens) so that a burst of long generations is
preempted. Everything is driven as a user would: the official `openai` client through the
gateway pod, kubectl, the system's Prometheus. The figures the issue asks for are printed with a
`REAL VLLM` prefix.

Two engines take ~5 GB of memory and a few minutes of both cores to start; the module removes
its service when it ends, giving the node's memory back to the modules after it.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import openai
import pytest

from e2e.system import LocalSystem, wait_for
from e2e.test_real_node import serving
from e2e.test_system import Tally, client
from llmfleet.core.images import vllm_cpu
from llmfleet.core.images.builder import source_root
from llmfleet.core.local import vllm_engine

pytestmark = pytest.mark.e2e

SERVICE = "tiny"
MODEL = vllm_engine.SERVED_NAME
USER_RETRIES = 2
"""The openai client's default retries (of a 5xx, 429 or connection error), where many requests
meet a CPU engine at once: what counts as failed is what failed after them."""
CANARY_INTERVAL, CANARY_MIN_REQUESTS = 30, 8
"""The canary analysis: a verdict per 30 s window holding at least 8 requests of the canary (a
CPU engine serving one sequence at a time answers a few a second at best)."""
KV_CACHE_BYTES = 8 * 2**20
"""4,096 tokens of the tiny model (2,048 bytes a token): two full-length sequences."""
MANIFEST = f"""
apiVersion: llmfleet.dev/v1alpha1
kind: InferenceService
metadata: {{name: {SERVICE}, namespace: default}}
spec:
  model: {{name: llmfleet/tiny-llama, source: "pvc://{vllm_engine.CLAIM}/model",
          servedName: {MODEL}, maxModelLen: 2048}}
  runtime:
    gpu: {{type: H100, count: 1}}
    resources: {{requests: {{cpu: 500m, memory: 2Gi}}, limits: {{memory: 5Gi}}}}
    shmSize: 256Mi
    extraArgs: ["--kv-cache-memory-bytes", "{KV_CACHE_BYTES}"]
    env:
      - {{name: LLMFLEET_RUNTIME_GPU, value: CPU}}
      - {{name: LLMFLEET_VLLM_VENV, value: /var/lib/llmfleet/models/{vllm_engine.CLAIM}/venv}}
      - {{name: VLLM_CPU_OMP_THREADS_BIND, value: nobind}}
      - {{name: OMP_NUM_THREADS, value: "1"}}
  topology:
    unified: {{replicas: 2, minReplicas: 2, maxReplicas: 2}}
  slo: {{ttftP95Ms: 2000}}
  autoscaling: {{enabled: true}}
  rollout:
    strategy: Canary
    steps: [{{weight: 50, pauseSeconds: 120}}]
    analysis: {{intervalSeconds: {CANARY_INTERVAL}, minRequests: {CANARY_MIN_REQUESTS}}}
"""
"""The sample (core/local/samples/vllm-cpu.yaml) with two autoscaled engines pinned at 2 (the
autoscaler reads their series but has no room to move), a small KV cache, a TTFT target and
canary rollouts (a change of the engine's flags is analysed at 50% before it is promoted)."""
READY_SECONDS = 900
"""Both engines started and warmed up (~1 min each alone on 2 cores; CI shares them)."""
WARMUP_REQUESTS = 2
"""The launcher's warm-up: 2 completions before the pod may turn Ready."""
PREFIX = "You are a careful assistant of a fleet of inference engines. " * 40
"""A shared prefix of several KV blocks (128 tokens each)."""
DRAIN_TOKENS = 400
"""Streams long enough to be in flight when the scale-down begins."""
BURST, BURST_TOKENS = 8, 1500
"""Concurrent generations that outgrow a 4,096-token cache: any three at once need 36 blocks
of its 32 (tests/runtime/test_real_vllm_cpu.py measured it on the engine alone)."""


@pytest.fixture(scope="module")
def tiny(system: LocalSystem, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSystem]:
    assert system.on_real_node, "no real node: `llmfleet up --real-node` fell back"
    built = vllm_cpu.built(source_root())
    if built is None:
        pytest.fail("vLLM's CPU build is not built: run `llmfleet images vllm-cpu` (make test "
                    "does)", pytrace=False)  # fmt: skip
    manifest = tmp_path_factory.mktemp("tiny") / "tiny.yaml"
    manifest.write_text(MANIFEST)
    vllm_engine.install(system.kubectl, built.root, services=manifest)
    try:
        wait_for(
            lambda: len(serving(system, SERVICE)) == 2 or None,
            READY_SECONDS,
            "two Ready vLLM engine pods",
            every=3,
        )
        system.wait_models([MODEL])
        for pod in system.pods(SERVICE):
            print(f"REAL VLLM pod create -> Ready {pod['metadata']['name']}: "
                  f"{_to_ready(pod):.0f} s")  # fmt: skip
        yield system
    finally:
        system.kubectl("delete", "inferenceservice", SERVICE, "-n", "default", "--wait=false")
        wait_for(lambda: not system.pods(SERVICE) or None, 120, "the vLLM pods gone")
        system.kubectl("delete", "pvc", vllm_engine.CLAIM, "-n", "default")
        system.kubectl("delete", "pv", vllm_engine.volume_name("default"))


def _to_ready(pod: dict[str, Any]) -> float:
    created = datetime.fromisoformat(pod["metadata"]["creationTimestamp"])
    return (_ready_at(pod) - created).total_seconds()


def _ready_at(pod: dict[str, Any]) -> datetime:
    condition = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
    return datetime.fromisoformat(condition["lastTransitionTime"])


def _by_pod(system: LocalSystem, promql: str) -> dict[str, float]:
    return {
        sample["metric"]["pod"]: float(sample["value"][1])
        for sample in system.query(promql)
        if "pod" in sample["metric"]
    }


def _series(system: LocalSystem, metric: str) -> dict[str, float]:
    """`metric` of the service's engines by pod (summed over its other labels, such as a
    counter's `finished_reason`), as the system's Prometheus scraped it."""
    return _by_pod(system, f'sum by (pod) ({metric}{{llmfleet_dev_service="{SERVICE}"}})')


def _settled(system: LocalSystem, metric: str, at_least: float) -> dict[str, float]:
    """`metric` by pod once its sum over the pods has reached `at_least` (a scrape or two)."""
    return wait_for(
        lambda: found if sum((found := _series(system, metric)).values()) >= at_least else None,
        60,
        f"{metric} of {SERVICE} summing to {at_least}",
        every=1,
    )


def test_chat_completions_and_streams_are_answered_by_real_vllm(tiny: LocalSystem) -> None:
    with client(tiny, timeout=120) as api:
        raw = api.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=8
        )
        answer = raw.parse()
        assert answer.choices[0].message.content
        assert answer.usage is not None
        assert answer.usage.completion_tokens > 0
        pods = {pod["status"]["podIP"]: pod["metadata"]["name"] for pod in tiny.pods(SERVICE)}
        host = _host(raw.headers["x-llmfleet-endpoint"])
        assert host in pods, (raw.headers["x-llmfleet-endpoint"], pods)
        completion = api.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8)
        assert completion.choices[0].text
        chunks = list(
            api.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Count"}], max_tokens=16,
                stream=True, extra_body={"ignore_eos": True},
            )
        )  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    print(f"REAL VLLM chat answered by {pods[host]}: {answer.choices[0].message.content!r}")


def test_each_pod_turned_ready_only_after_the_launchers_warm_up(tiny: LocalSystem) -> None:
    """The launcher holds /ready until its warm-up requests were served by the engine: the
    engine counted them, and the launcher logged the end of its warm-up before the kubelet
    turned the pod Ready."""
    for pod in tiny.pods(SERVICE):
        name = pod["metadata"]["name"]
        logs = tiny.kubectl("logs", "-n", "default", name)
        line = next(line for line in logs.splitlines() if " ready after " in line)
        # Its count: GET /v1/models, then each warm-up request (and any sent again).
        made = re.search(r"\(warm-up: (\d+) requests\)", line)
        assert made is not None, line
        assert int(made.group(1)) >= 1 + WARMUP_REQUESTS, line
        logged = datetime.fromisoformat(line.split(" llmfleet-runtime ")[0].replace(",", "."))
        became_ready = _ready_at(pod).replace(tzinfo=None)
        # The log's clock is the node's (UTC here), the condition's the API's (1 s resolution).
        assert logged.replace(microsecond=0) <= became_ready, (line, became_ready)
        print(f"REAL VLLM {name}: {line.split(' INFO ')[-1]}; Ready at {became_ready:%H:%M:%S}")
    served = _settled(tiny, "vllm:request_success_total", 2 * WARMUP_REQUESTS)
    assert all(count >= WARMUP_REQUESTS for count in served.values()), served


def test_repeated_prefixes_go_to_the_engine_whose_prefix_cache_hits(tiny: LocalSystem) -> None:
    """Requests sharing a long prefix, one after another: the gateway's prefix-aware routing
    sends them to one engine, and that engine's prefix-cache hit counter is the one that rises."""
    before_hits = _series(tiny, "vllm:prefix_cache_hits_total")
    before_done = _series(tiny, "vllm:request_success_total")
    requests = 12
    served_by: list[str] = []
    with client(tiny, timeout=120) as api:
        for n in range(requests):
            raw = api.completions.with_raw_response.create(
                model=MODEL, prompt=f"{PREFIX}Question {n}: why?", max_tokens=4
            )
            served_by.append(raw.headers["x-llmfleet-endpoint"])
    done = _settled(tiny, "vllm:request_success_total", sum(before_done.values()) + requests)
    hits = _series(tiny, "vllm:prefix_cache_hits_total")
    gained = {pod: hits.get(pod, 0) - before_hits.get(pod, 0) for pod in done}
    top = max(gained, key=lambda pod: gained[pod])
    routed = max(served_by.count(endpoint) for endpoint in set(served_by))
    print(f"REAL VLLM prefix routing: {routed} of {requests} requests to one engine; prefix-"
          f"cache hits gained by pod {gained}")  # fmt: skip
    assert routed >= requests - 1, served_by
    assert gained[top] > 0
    assert sum(gained.values()) - gained[top] <= 0.1 * gained[top], gained


def test_the_gateway_autoscaler_and_rules_read_the_real_series(tiny: LocalSystem) -> None:
    """What llmfleet reads of vLLM, read from the real engines: the recording rules' pool
    series, the autoscaler's decision with its reading of the TTFT histogram, and no
    MetricsMissing."""
    with client(tiny, timeout=120) as api:
        for n in range(6):
            api.completions.create(model=MODEL, prompt=f"Tell me about {n}", max_tokens=8)

    def recorded() -> list[dict[str, Any]] | None:
        found = tiny.query(
            f'llmfleet_pool:ttft_seconds:p95_rate1m{{llmfleet_dev_service="{SERVICE}"}}'
        )
        return found or None

    wait_for(recorded, 90, "the recording rules' TTFT p95 of the vLLM pool", every=2)

    def decided() -> dict[str, Any] | None:
        status = tiny.get("inferenceservice", SERVICE, "-n", "default").get("status", {})
        pool = status.get("autoscaling", {}).get("pools", {}).get("unified", {})
        misses = pool.get("ttftMisses") or {}
        return status if misses.get("requests", 0) > 0 else None

    status = wait_for(decided, 120, "the autoscaler's reading of the engines' TTFT", every=2)
    autoscaling = status["autoscaling"]
    print(f"REAL VLLM autoscaler: {autoscaling['pools']['unified']}")
    assert autoscaling["pools"]["unified"]["active"] == 2
    assert "metricsMissingSince" not in autoscaling
    kv = _series(tiny, "vllm:kv_cache_usage_perc")
    assert len(kv) == 2, kv
    assert all(0 <= value <= 1 for value in kv.values()), kv


class Streams:
    """Streams started one by one until both engines carry at least one (the gateway's endpoint
    header says which), each then read to its end in a thread of its own."""

    def __init__(self, system: LocalSystem) -> None:
        self.system = system
        self.tally = Tally()
        self.endpoints: list[str] = []
        self.threads: list[threading.Thread] = []

    def start_one(self, n: int) -> None:
        api = client(self.system, timeout=300)
        raw = api.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": f"Story {n}: write at length"}],
            max_tokens=DRAIN_TOKENS, stream=True, extra_body={"ignore_eos": True},
        )  # fmt: skip
        self.endpoints.append(raw.headers["x-llmfleet-endpoint"])
        thread = threading.Thread(target=self._read, args=(api, raw.parse()), daemon=True)
        self.threads.append(thread)
        thread.start()

    def _read(self, api: openai.OpenAI, stream: Any) -> None:
        try:
            finish = None
            for chunk in stream:
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
            self.tally.add("ok" if finish == "length" else "lost")
        except openai.APIError as error:
            self.tally.add(type(error).__name__)
        finally:
            api.close()

    def join(self) -> None:
        for thread in self.threads:
            thread.join(300)
            assert not thread.is_alive(), "a stream hung"


def test_a_scale_down_drains_in_flight_streams(tiny: LocalSystem) -> None:
    """Streams run on both engines when the pool goes from 2 to 1: the pod that goes is taken
    out of routing, its launcher drains (preStop) and every stream finishes, those it carried
    included."""
    ips = {pod["status"]["podIP"]: pod["metadata"]["name"] for pod in tiny.pods(SERVICE)}
    streams = Streams(tiny)
    while len({ips[_host(e)] for e in streams.endpoints}) < 2 and len(streams.endpoints) < 8:
        streams.start_one(len(streams.endpoints))
    carried = {name: sum(ips[_host(e)] == name for e in streams.endpoints) for name in ips.values()}
    assert all(carried.values()), f"the gateway sent no stream to one engine: {carried}"
    began = time.monotonic()
    tiny.kubectl("patch", "inferenceservice", SERVICE, "-n", "default", "--type=merge", "-p",
                 '{"spec":{"topology":{"unified":{"replicas":1,"minReplicas":1,'
                 '"maxReplicas":1}}}}')  # fmt: skip
    streams.join()
    wait_for(lambda: len(tiny.pods(SERVICE)) == 1 or None, 180, "one vLLM pod left")
    gone = next(name for name in ips.values() if name not in serving(tiny, SERVICE))
    print(streams.tally.row("scale-down of real vLLM under streams"))
    print(f"REAL VLLM scale-down: {gone} (carrying {carried[gone]} of {len(streams.endpoints)} "
          f"streams) gone {time.monotonic() - began:.0f} s after the patch")  # fmt: skip
    assert streams.tally.answered == len(streams.endpoints), streams.tally.row("scale-down")
    assert streams.tally.lost == 0
    assert not streams.tally.failed


def _host(endpoint: str) -> str:
    """The address in the gateway's `x-llmfleet-endpoint` (`http://IP:PORT`)."""
    return endpoint.split("//", 1)[1].rsplit(":", 1)[0]


def test_a_forced_preemption_shows_in_the_alert_that_watches_it(tiny: LocalSystem) -> None:
    """Long generations outgrow the engine's small KV cache: vLLM preempts, and the chart's
    LLMFleetPreemptionsRising alert turns pending for the service (it fires after its `for`)."""
    tally = Tally()

    def generate() -> None:
        # The openai client's own retries (2, its default): with all eight arriving at once on a
        # saturated 2-core machine the gateway's connect to the one engine can time out (2 s).
        with client(tiny, timeout=600).with_options(max_retries=USER_RETRIES) as api:
            try:
                api.completions.create(
                    model=MODEL, prompt="Go on:", max_tokens=BURST_TOKENS,
                    extra_body={"ignore_eos": True},
                )  # fmt: skip
                tally.add("ok")
            except openai.APIError as error:
                tally.add(type(error).__name__)

    threads = [threading.Thread(target=generate, daemon=True) for _ in range(BURST)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
        assert not thread.is_alive(), "a generation hung"
    print(tally.row("KV cache outgrown"))
    assert tally.answered == BURST
    preempted = _settled(tiny, "vllm:num_preemptions_total", 1)
    print(f"REAL VLLM preemptions: {preempted}")

    def alert() -> list[dict[str, Any]] | None:
        found = tiny.query(
            f'ALERTS{{alertname="LLMFleetPreemptionsRising",llmfleet_dev_service="{SERVICE}"}}'
        )
        return found or None

    alerts = wait_for(alert, 120, "LLMFleetPreemptionsRising for the vLLM service", every=2)
    assert alerts[0]["metric"]["alertstate"] in ("pending", "firing")


class Load:
    """Closed-loop streamed chats through the gateway from a few clients, a session each
    request, each counted by the revision that answered (`x-llmfleet-revision`)."""

    def __init__(self, system: LocalSystem, clients: int = 4) -> None:
        self.system = system
        self.clients = clients
        self.stop = threading.Event()
        self.tally = Tally()
        self.revisions: list[str] = []
        self.threads: list[threading.Thread] = []

    def _work(self, n: int) -> None:
        with client(self.system, timeout=120).with_options(max_retries=USER_RETRIES) as api:
            while not self.stop.is_set():
                try:
                    raw = api.chat.completions.with_raw_response.create(
                        model=MODEL, messages=[{"role": "user", "content": f"Client {n}: go"}],
                        max_tokens=16, stream=True, extra_body={"ignore_eos": True},
                        extra_headers={"x-session-id": f"{n}-{time.monotonic_ns()}"},
                    )  # fmt: skip
                    finish = None
                    for chunk in raw.parse():
                        if chunk.choices and chunk.choices[0].finish_reason:
                            finish = chunk.choices[0].finish_reason
                    self.revisions.append(raw.headers.get("x-llmfleet-revision", ""))
                    self.tally.add("ok" if finish == "length" else "lost")
                except openai.APIError as error:
                    self.tally.add(type(error).__name__)
                    time.sleep(0.25)

    def __enter__(self) -> Load:
        for n in range(self.clients):
            self.threads.append(threading.Thread(target=self._work, args=(n,), daemon=True))
            self.threads[-1].start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(120)
            assert not thread.is_alive(), "a client hung"


def _status(system: LocalSystem) -> dict[str, Any]:
    found: dict[str, Any] = system.get("inferenceservice", SERVICE, "-n", "default").get(
        "status", {}
    )
    return found


def test_a_canary_with_a_slower_engine_flag_is_rolled_back_on_latency(tiny: LocalSystem) -> None:
    """The engine's flags change to `--max-num-seqs 1` (one sequence at a time: a request waits
    for the one before it): the canary's real TTFT, read by the operator's analysis from
    Prometheus, lands in a higher histogram bucket than stable's, and the canary is rolled back
    with no failed request."""
    stable = _status(tiny)["revision"]
    slower = json.dumps({"spec": {"runtime": {"extraArgs": [
        "--kv-cache-memory-bytes", str(KV_CACHE_BYTES), "--max-num-seqs", "1"]}}})  # fmt: skip
    tiny.kubectl("patch", "inferenceservice", SERVICE, "-n", "default", "--type=merge", "-p",
                 slower)  # fmt: skip
    canary = wait_for(
        lambda: (
            ((c := (_status(tiny).get("canary") or {}).get("revision")) != stable and c) or None
        ),
        60,
        "the canary to start",
    )
    # The load begins once the canary's engine serves its step: on 2 cores a busy stable engine
    # would slow the canary's start several times over, and the step waits for it anyway.
    wait_for(
        lambda: (_status(tiny).get("canary") or {}).get("stepStartedAt"),
        READY_SECONDS,
        "the canary's engine to serve its step",
        every=2,
    )
    with Load(tiny) as load:
        served = time.monotonic()
        wait_for(
            lambda: (_status(tiny).get("canary") or {}).get("phase") == "RolledBack" or None,
            300,
            "the rollback",
            every=1,
        )
        verdict = time.monotonic() - served
        time.sleep(5)
    degraded = next(c for c in _status(tiny)["conditions"] if c["type"] == "Degraded")
    on_canary = load.revisions.count(canary)
    print(load.tally.row("real vLLM canary rolled back"))
    print(f"REAL VLLM canary: {on_canary} of {len(load.revisions)} requests on the canary; "
          f"rolled back {verdict:.0f} s after the load began on its served step: "
          f"{degraded['message']}")  # fmt: skip
    assert (degraded["status"], degraded["reason"]) == ("True", "CanaryRolledBack")
    assert "TTFT p95 of the canary" in degraded["message"], degraded["message"]
    assert _status(tiny)["revision"] == stable
    assert on_canary >= CANARY_MIN_REQUESTS
    assert not load.tally.failed, load.tally.row("canary")
    assert load.tally.lost == 0
