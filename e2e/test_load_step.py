"""A load step x4 from steady state with autoscaling on, `warmSpares: 1` against `0`.

Two services that differ only in `warmSpares` get the same open-loop traffic at once: 1
request/s for `STEADY_S`, then 4 requests/s for `STEP_S` (each request a 200-token prompt and
50 generated tokens, 1-2 s on a local engine whose `maxNumSeqs` is 4: one engine serves the
steady load and needs help with the step). Measured: seconds from the step to a second serving
pod, and TTFT p95 of the requests sent during the step. The figures are printed (`STEP …`
lines) and the test asserts only what must hold: both services add serving capacity, the
spare's service does not add it later than the other, and at most 2% of requests fail.

Figures depend on the local engines' documented cold start (engines.COLD_START_SECONDS), the
autoscaler's passes in the local system (full every 5 s, fast every second: the fast pass
promotes the spare on the first queued request, `autoscaler/promote.py`) and Prometheus's
scrape (2 s). `LLMFLEET_AUTOSCALER_FAST_INTERVAL_SECONDS=0` in the environment runs the system
without fast passes (issue 30's baseline).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import httpx
import pytest

from e2e.system import LocalSystem, wait_for

pytestmark = pytest.mark.e2e

STEADY_S = 30.0
STEP_S = 60.0
BASE_RATE = 1.0
STEP_FACTOR = 4

SERVICES = """
apiVersion: llmfleet.dev/v1alpha1
kind: InferenceService
metadata: {{name: {name}, namespace: default}}
spec:
  model: {{name: Qwen/Qwen2.5-1.5B-Instruct, servedName: {name}}}
  runtime:
    gpu: {{type: H100, count: 1}}
    maxNumSeqs: 4
    resources: {{requests: {{cpu: 100m, memory: 384Mi}}}}  # the real node's engines: simulators
  topology: {{unified: {{replicas: 1, minReplicas: 1, maxReplicas: 4}}}}
  slo: {{ttftP95Ms: 500, itlP95Ms: 50}}
  autoscaling: {{enabled: true, warmSpares: {spares}}}
"""


@dataclass
class Run:
    name: str
    spares: int
    ttft_step: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    added_after: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


def _one(system: LocalSystem, run: Run, during_step: bool) -> None:
    body = {
        "model": run.name, "prompt": "hello " * 200, "max_tokens": 50,
        "stream": True, "ignore_eos": True,
    }  # fmt: skip
    started = time.monotonic()
    first = None
    try:
        with httpx.stream(
            "POST", f"{system.base_url}/completions", json=body, timeout=180, trust_env=False
        ) as answer:
            if answer.status_code != 200:
                raise RuntimeError(f"HTTP {answer.status_code}: {answer.read()[:300]!r}")
            for line in answer.iter_lines():
                if first is None and line.startswith("data:"):
                    first = time.monotonic() - started
    except (httpx.HTTPError, RuntimeError) as error:
        with run.lock:
            run.errors.append(repr(error))
        return
    if during_step and first is not None:
        with run.lock:
            run.ttft_step.append(first)


def _send(system: LocalSystem, run: Run, rate: float, seconds: float, during_step: bool) -> None:
    """Open loop: one request every 1/rate seconds, each on its own thread."""
    start = time.monotonic()
    threads = []
    for i in range(int(rate * seconds)):
        time.sleep(max(0.0, start + i / rate - time.monotonic()))
        thread = threading.Thread(target=_one, args=(system, run, during_step), daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join(150)


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, int(0.95 * len(ordered)) - 1)]


def test_load_step_spares_vs_none(system: LocalSystem) -> None:
    runs = [Run("step-spare", 1), Run("step-cold", 0)]
    manifest = "---".join(SERVICES.format(name=run.name, spares=run.spares) for run in runs)
    system.kubectl("apply", "-f", "-", stdin=manifest)
    try:
        system.wait_models([run.name for run in runs], timeout=120)
        for run in runs:  # steady state: one serving pod each (and its spare, where asked)
            wait_for(
                lambda run=run: True if len(system.serving(run.name, "unified")) == 1 else None,
                60, f"{run.name} to serve from one pod",
            )  # fmt: skip
        steady = [
            threading.Thread(target=_send, args=(system, run, BASE_RATE, STEADY_S, False))
            for run in runs
        ]
        for thread in steady:
            thread.start()
        for thread in steady:
            thread.join()
        stepped = time.monotonic()
        step = [
            threading.Thread(
                target=_send, args=(system, run, BASE_RATE * STEP_FACTOR, STEP_S, True)
            )
            for run in runs
        ]
        for thread in step:
            thread.start()
        while any(thread.is_alive() for thread in step):
            for run in runs:
                if run.added_after is None and len(system.serving(run.name, "unified")) > 1:
                    run.added_after = time.monotonic() - stepped
            time.sleep(0.5)
        for run in runs:
            added = "never" if run.added_after is None else f"{run.added_after:.1f} s"
            ttft = f"{p95(run.ttft_step) * 1000:.0f} ms" if run.ttft_step else "-"
            print(
                f"STEP x{STEP_FACTOR} warmSpares={run.spares}: serving capacity added after "
                f"{added}; TTFT p95 during the step {ttft} ({len(run.ttft_step)} requests); "
                f"errors {len(run.errors)} {run.errors[:3]}"
            )
        for run in runs:
            assert run.added_after is not None, f"{run.name} never added serving capacity"
            # On this 2-core machine the step starves every process of CPU; the gateway has been
            # seen to answer one request in 240 with 503 no_endpoint then (noted on issue 14).
            assert len(run.errors) <= len(run.ttft_step) // 50, run.errors
        spare, cold = runs
        assert spare.added_after is not None
        assert cold.added_after is not None
        assert spare.added_after <= cold.added_after + 2.0
    finally:
        for run in runs:
            system.kubectl("delete", "inferenceservice", run.name, "-n", "default", "--wait=false")
        # The tests after this one find the system as `make up` left it: these services' pods
        # gone (the collector deletes them after their Deployments).
        for run in runs:
            wait_for(lambda run=run: True if not system.pods(run.name) else None, 180,
                     f"{run.name}'s pods to be gone")  # fmt: skip
