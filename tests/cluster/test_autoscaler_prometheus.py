"""Issue 6's acceptance: `llmfleet autoscaler`, a real process, sizes a decode pool from a real
Prometheus and writes the decision to the local cluster; a stopped Prometheus holds the count.

Prometheus (Debian's package, on 127.0.0.1) scrapes llm-d-inference-sim engines labelled as the
service's pools, as the ServiceMonitor labels real engine pods. The operator runs the pools' pods
on kwok nodes, where nothing runs: the engines stand in for them and no traffic ever goes to a
pod IP. The capacity profile gives a decode replica 2 streams within the ITL target, so closed-
loop clients keeping about five requests in flight on the decode engines (2 sequences each, the
rest queued) need two or three replicas, and up to the maximum of four when the forecast reads
the rising load as growth; the idle pool needs none and keeps its minimum of one.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from llmfleet.core.capacity_profile import MaxConcurrency
from llmfleet.crds import labels as L
from tests.autoscaler.builders import PROFILE
from tests.autoscaler.prom import EngineSpec, Load, Prometheus, engines
from tests.cluster.autoscaler_stack import AutoscalerProcess
from tests.cluster.kube import Kube, wait_ready

pytestmark = pytest.mark.cluster

NAMESPACE = f"as-prom-{os.getpid() % 10000}"
NAME = "chat"
MODEL = "Qwen/Qwen2.5-7B-Instruct"
MAX_DECODE = 4
INTERVAL_S = 1.0
SERVICE = f"""
apiVersion: llmfleet.dev/v1alpha1
kind: InferenceService
metadata:
  name: {NAME}
spec:
  model: {{name: "{MODEL}"}}
  runtime:
    gpu: {{type: H100, count: 1}}
  topology:
    mode: Disaggregated
    prefill: {{replicas: 1, minReplicas: 1, maxReplicas: 1}}
    decode: {{replicas: 1, minReplicas: 1, maxReplicas: {MAX_DECODE}}}
    kvTransfer: {{connector: NixlConnector}}
  slo: {{itlP95Ms: 50}}
  autoscaling: {{enabled: true}}
"""
LATENCY = ("--time-to-first-token", "100ms", "--inter-token-latency", "25ms")
DECODE = EngineSpec(NAMESPACE, NAME, "decode", (*LATENCY, "--max-num-seqs", "2"))
PREFILL = EngineSpec(NAMESPACE, NAME, "prefill", LATENCY)
WORKERS = 5


def write_profiles(directory: Path) -> Path:
    """The test profile for the service's model, cut to 2 concurrent streams per replica."""
    directory.mkdir()
    profile = PROFILE.model_copy(
        update={
            "model": MODEL,
            "max_concurrency": MaxConcurrency(value=2, limited_by="queueing", tested_up_to=4),
        }
    )
    (directory / "chat.json").write_text(profile.model_dump_json(by_alias=True))
    return directory


def autoscaling(kube: Kube) -> dict[str, Any]:
    """`status.autoscaling` as the API server has it."""
    body = kube.get(f"inferenceservices.llmfleet.dev/{NAME}", "-n", NAMESPACE)
    found: dict[str, Any] = (body.get("status") or {}).get("autoscaling") or {}
    return found


def decode(status: dict[str, Any]) -> dict[str, Any]:
    pool: dict[str, Any] = (status.get("pools") or {}).get("decode") or {}
    return pool


def wait_status(
    kube: Kube, check: Callable[[dict[str, Any]], bool], timeout: float, what: str
) -> dict[str, Any]:
    """Poll `status.autoscaling` until `check` holds for it; that status."""

    def poll() -> dict[str, Any]:
        status = autoscaling(kube)
        return status if status and check(status) else {}

    return Kube.wait_for(poll, timeout, what, interval=0.5)


def decided_at(status: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(status["lastDecisionTime"].replace("Z", "+00:00"))


def ready_decode_pods(kube: Kube) -> int:
    selector = f"{L.SERVICE}={NAME},{L.POOL}=decode,{L.SERVING}=true"
    pods = kube.get("pods", "-n", NAMESPACE, "-l", selector)["items"]
    return sum(
        1
        for pod in pods
        if not pod["metadata"].get("deletionTimestamp")
        and any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in pod.get("status", {}).get("conditions") or []
        )
    )


def actuated(kube: Kube) -> int | None:
    """The decided decode count once as many decode pods serve Ready, else None."""
    active: int = decode(autoscaling(kube))["active"]
    return active if ready_decode_pods(kube) == active else None


def steady(read: Callable[[], int | None], seconds: float, timeout: float, what: str) -> int:
    """Poll `read` until it gave the same value, not None, for `seconds`; that value."""
    since, last = time.monotonic(), read()

    def check() -> int | None:
        nonlocal since, last
        value = read()
        if value is None or value != last:
            since, last = time.monotonic(), value
        return value if value is not None and time.monotonic() - since >= seconds else None

    result: int | None = Kube.wait_for(check, timeout, what, interval=0.5)
    assert result is not None
    return result


def test_load_scales_decode_up_and_a_stopped_prometheus_holds_the_count(
    kube: Kube,
    operator_namespace: str,
    prometheus: Prometheus,
    sim_binary: Path,
    tmp_path: Path,
) -> None:
    kube.kubectl("apply", "--server-side", "-n", operator_namespace, "-f", "-", stdin=SERVICE)
    wait_ready(kube, operator_namespace, NAME)
    with engines(sim_binary, DECODE, DECODE, PREFILL) as started:
        prometheus.set_targets(started)
        prometheus.wait_scraped(started)
        profiles = write_profiles(tmp_path / "profiles")
        scaler = AutoscalerProcess(
            kube, tmp_path / "autoscaler.log", NAMESPACE, prometheus.url, profiles,
            interval=INTERVAL_S,
            # Rewrite an unchanged decision every other pass, so its reason stays current.
            env={"LLMFLEET_AUTOSCALER_STATUS_REFRESH_SECONDS": "2"},
        )  # fmt: skip
        try:
            # Idle: sized from the metrics (not held for want of them) at the minimum of one.
            idle = decode(wait_status(kube, lambda s: bool(decode(s)), 30, "a first decision"))
            print(f"\nidle: {idle}")
            assert idle["active"] == 1
            assert idle["reason"].startswith("steady at 1"), idle["reason"]

            with Load(started[:2], workers=WORKERS).running() as load:
                started_at = time.monotonic()
                up = decode(
                    wait_status(kube, lambda s: decode(s)["active"] > 1, 30, "a larger count")
                )
                print(f"up after {time.monotonic() - started_at:.1f} s: {up}")
                assert "decode" in up["reason"]
                assert up["active"] <= MAX_DECODE

                # The operator runs the pods and the count stays put for a few passes.
                count = steady(lambda: actuated(kube), 3, 60, "as many decode pods as decided")
                events = kube.get(
                    "events", "-n", operator_namespace, "--field-selector", "reason=Scaled"
                )
                scaled = [e["message"] for e in events["items"]]
                print(f"steady at {count}; Scaled events: {scaled}")
                assert any(m.startswith("decode: 1 -> ") and "scale up" in m for m in scaled)

                prometheus.stop()
                stopped = datetime.now(UTC)
                held = wait_status(
                    kube, lambda s: "metrics missing" in decode(s)["reason"], 30, "the hold"
                )
                later = wait_status(
                    kube,
                    lambda s: (decided_at(s) - stopped).total_seconds() >= 5 * INTERVAL_S,
                    30,
                    "a decision five passes after the stop",
                )
                print(f"held: {decode(held)}\nlater: {decode(later)}; sent {len(load.done)}")
            for status in (held, later):
                assert decode(status)["active"] == count
                assert decode(status)["reason"].startswith(f"holding {count} active")
                assert "metrics missing (signals unavailable: " in decode(status)["reason"]
            # The first hold may come from a query Prometheus answered while shutting down (503
            # Service Unavailable); five passes later it is gone (connection refused).
            assert re.search(r"Connection refused|503", decode(held)["reason"]), decode(held)
            assert "Connection refused" in decode(later)["reason"]
            assert scaler.process.poll() is None, "the autoscaler outlives its Prometheus"
            assert "unavailable" in scaler.text()
        finally:
            scaler.stop()
            print(f"--- autoscaler log (tail)\n{scaler.text()[-4000:]}")
