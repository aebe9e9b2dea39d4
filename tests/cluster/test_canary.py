"""Canary rollouts on the real API server (issue 18): the operator process starts a canary
Deployment and Service beside the stable ones, walks the steps on verdicts it reads from a real
Prometheus, promotes (the canary's Deployment becomes the stable one, the old one drains and
goes) or rolls back (weight 0, the canary drained and removed, Degraded with both figures, a
Warning), waits without samples, holds while Prometheus is down, and resumes at the same step
after being killed.

Nothing runs inside the kwok pods, so the figures come from an exporter in this process that
speaks as the gateway and the engines would (the same metric names and labels, per revision):
what it says of each revision is what the test wants the analysis to see. The query and its
figures against real engines and a real gateway are tested in
tests/operator/test_analysis_prometheus.py.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from llmfleet.crds import labels as L
from tests.autoscaler.prom import Prometheus, Target
from tests.cluster.kube import (
    Kube,
    condition,
    install_crds,
    serving_endpoints,
    wait_endpoints,
    wait_ready,
)
from tests.cluster.operator_process import OperatorProcess
from tests.net import free_port

pytestmark = pytest.mark.cluster

NAMESPACE = f"canary-{os.getpid() % 10000}"
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)


@dataclass(frozen=True)
class Behaviour:
    """What one revision's requests look like, ten times a second."""

    requests: int = 3
    errors: int = 0
    ttft: float = 0.05
    itl: float = 0.02


HEALTHY = Behaviour()
SLOW = Behaviour(itl=0.09)
FEW = Behaviour(requests=0)


class Exporter:
    """Series of the gateway (requests by revision and outcome) and the engines (TTFT and ITL
    histograms by revision) for one service, as Prometheus scrapes them."""

    def __init__(self, namespace: str, service: str) -> None:
        self.namespace, self.service = namespace, service
        registry = CollectorRegistry()
        self.requests = Counter("llmfleet_gateway_requests", "requests",
                                ["namespace", "service", "pool", "model", "revision", "outcome"],
                                registry=registry)  # fmt: skip
        engine = ["namespace", "llmfleet_dev_service", "llmfleet_dev_pool", "revision"]
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "ttft", engine,
                              buckets=TTFT_BUCKETS, registry=registry)  # fmt: skip
        self.itl = Histogram("vllm:inter_token_latency_seconds", "itl", engine,
                             buckets=ITL_BUCKETS, registry=registry)  # fmt: skip
        self.revisions: dict[str, Behaviour] = {}
        self.port = free_port()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = bytes(generate_latest(registry))
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.stopped = threading.Event()
        self.threads = [threading.Thread(target=self.server.serve_forever, daemon=True),
                        threading.Thread(target=self._tick, daemon=True)]  # fmt: skip
        for thread in self.threads:
            thread.start()

    def _tick(self) -> None:
        while not self.stopped.wait(0.1):
            for revision, behaviour in list(self.revisions.items()):
                gateway = (self.namespace, self.service, "unified", "m", revision)
                engine = (self.namespace, self.service, "unified", revision)
                self.requests.labels(*gateway, "ok").inc(behaviour.requests - behaviour.errors)
                self.requests.labels(*gateway, "upstream_error").inc(behaviour.errors)
                for _ in range(behaviour.requests):
                    self.ttft.labels(*engine).observe(behaviour.ttft)
                    self.itl.labels(*engine).observe(behaviour.itl)

    def stop(self) -> None:
        self.stopped.set()
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Rig:
    kube: Kube
    ns: str
    prometheus: Prometheus
    exporter: Exporter
    operator: OperatorProcess
    log: Path

    def restart_operator(self, kill: bool = False) -> None:
        if kill:
            self.operator.process.send_signal(signal.SIGKILL)
            self.operator.process.wait(10)
        self.operator.stop()  # closes its log (and stops it unless killed)
        self.operator = operator(self.kube, self.log, self.prometheus.url)


def operator(kube: Kube, log: Path, prometheus: str) -> OperatorProcess:
    return OperatorProcess(kube, log, "--standalone", "-n", NAMESPACE, env={
        "LLMFLEET_OPERATOR_PROMETHEUS_URL": prometheus,
        "LLMFLEET_OPERATOR_ANALYSIS_TIMEOUT_SECONDS": "2",
        "LLMFLEET_OPERATOR_NETWORK_POLICY": "false",
    })  # fmt: skip


@pytest.fixture
def rig(kube: Kube, prometheus_binary: Path, tmp_path: Path) -> Iterator[Rig]:
    install_crds(kube)
    kube.kubectl("create", "namespace", NAMESPACE)
    exporter = Exporter(NAMESPACE, "chat")
    log = tmp_path / "operator.log"
    with Prometheus(prometheus_binary, tmp_path / "prometheus", lifecycle=True) as prom:
        prom.set_targets([], exporters=[Target(f"127.0.0.1:{exporter.port}")])
        found = Rig(kube, NAMESPACE, prom, exporter, operator(kube, log, prom.url), log)
        try:
            yield found
        finally:
            found.operator.stop()
            exporter.stop()
            print(found.operator.text()[-6000:])
            kube.kubectl("delete", "namespace", NAMESPACE, "--timeout=120s")


FIRST_PAUSE_S = 15
"""The first step's pause: the kill test restarts the operator inside it and expects the same
step afterwards, so it must outlast a kill, a restart and the test's own wait on a loaded
machine (6 s left about 2 s of margin)."""


def manifest(value: str, *, min_requests: int = 20) -> str:
    return json.dumps({
        "apiVersion": "llmfleet.dev/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": "chat", "namespace": NAMESPACE},
        "spec": {
            "model": {"name": "m"},
            "runtime": {"env": [{"name": "V", "value": value}]},
            "topology": {"unified": {"replicas": 2}},
            "slo": {"ttftP95Ms": 500},
            "rollout": {"strategy": "Canary",
                        "steps": [{"weight": 50, "pauseSeconds": FIRST_PAUSE_S},
                                  {"weight": 100, "pauseSeconds": 6}],
                        "analysis": {"intervalSeconds": 5, "minRequests": min_requests}},
        },
    })  # fmt: skip


def status(rig: Rig) -> dict[str, Any]:
    found: dict[str, Any] = rig.kube.get("llmsvc/chat", "-n", rig.ns).get("status", {})
    return found


def canary_if(rig: Rig, test: Any) -> dict[str, Any]:
    """The canary status when `test(it)` holds, else {} (for `wait_for`)."""
    found = canary(rig)
    return found if test(found) else {}


def canary(rig: Rig) -> dict[str, Any]:
    found: dict[str, Any] = status(rig).get("canary") or {}
    return found


def in_progress(rig: Rig, reason: str) -> dict[str, Any]:
    """The canary status once CanaryInProgress says `reason` ({} before)."""
    said = condition(rig.kube, rig.ns, "chat", "CanaryInProgress").get("reason")
    return canary(rig) if said == reason else {}


def deployments(rig: Rig) -> dict[str, dict[str, Any]]:
    items = rig.kube.get("deployments", "-n", rig.ns, "-l", f"{L.SERVICE}=chat")["items"]
    return {item["metadata"]["name"]: item for item in items}


def events(rig: Rig) -> list[tuple[str, str, str]]:
    items = rig.kube.get("events", "-n", rig.ns, "--field-selector",
                         "involvedObject.kind=InferenceService")["items"]  # fmt: skip
    return [(e["type"], e["reason"], e["message"]) for e in items]


def start(rig: Rig, *, min_requests: int = 20) -> str:
    """chat at V=1, serving; its revision."""
    rig.kube.kubectl("apply", "--server-side", "-f", "-", stdin=manifest("1"))
    wait_ready(rig.kube, rig.ns, "chat")
    revision = str(rig.kube.wait_for(lambda: status(rig).get("revision"), 30, "a revision"))
    rig.exporter.revisions[revision] = HEALTHY
    return revision


def change(rig: Rig, value: str, behaviour: Behaviour, *, min_requests: int = 20) -> str:
    """The spec at V=`value`: a new revision whose canary behaves as `behaviour`."""
    before = status(rig)["revision"]
    rig.kube.kubectl("apply", "--server-side", "-f", "-",
                     stdin=manifest(value, min_requests=min_requests))  # fmt: skip
    revision = str(rig.kube.wait_for(
        lambda: (canary(rig).get("revision") or None) if canary(rig).get("revision") != before
        else None, 30, "the canary to start"))  # fmt: skip
    rig.exporter.revisions[revision] = behaviour
    return revision


def test_a_healthy_canary_is_promoted_and_survives_an_operator_kill(rig: Rig) -> None:
    old = start(rig)
    assert list(deployments(rig)) == ["chat-unified"]
    stable_template = deployments(rig)["chat-unified"]["spec"]["template"]
    new = change(rig, "2", HEALTHY)
    name = L.revision_child_name("chat", "unified", new)

    # The canary: its own Deployment (one pod for 50% of 2) and Service; the stable one intact.
    rig.kube.wait_for(lambda: serving_endpoints(rig.kube, rig.ns, name), 60,
                      "the canary's pod in its Service's EndpointSlice")  # fmt: skip
    found = deployments(rig)
    assert found[name]["spec"]["replicas"] == 1
    assert found[name]["spec"]["selector"]["matchLabels"][L.DEPLOYMENT] == name
    assert found["chat-unified"]["spec"]["template"] == stable_template
    # The EndpointSlice controller follows pod readiness asynchronously: wait, not sample.
    wait_endpoints(rig.kube, rig.ns, "chat-unified", 2)
    pods = rig.kube.get("pods", "-n", rig.ns, "-l", f"{L.DEPLOYMENT}={name}")["items"]
    assert [p["metadata"]["labels"][L.SERVING] for p in pods] == [L.SERVING_CANARY]
    assert [p["metadata"]["labels"][L.REVISION] for p in pods] == [new]
    # The status the listing shows is written by the operator's pass, which races the
    # EndpointSlice controller that put the canary's pod in its slice above.
    rig.kube.wait_for(
        lambda: "canary 1/1 (50%)" in (listing := rig.kube.kubectl("get", "llmsvc", "-n", rig.ns))
        and "Progressing" in listing,
        30, "the listing to show the canary serving 1/1 at 50%, Progressing",
    )  # fmt: skip

    # Killed once the first step's clock runs: the new process resumes at the same step.
    at = rig.kube.wait_for(lambda: canary_if(rig, lambda c: c.get("stepStartedAt")), 60,
                           "the first step to start")  # fmt: skip
    rig.restart_operator(kill=True)
    time.sleep(3)
    again = canary(rig)
    assert (again["step"], again["stepStartedAt"]) == (at["step"], at["stepStartedAt"])
    assert sorted(deployments(rig)) == sorted(["chat-unified", name])

    promoted = rig.kube.wait_for(
        lambda: canary(rig).get("phase") == "Promoted" and "chat-unified" not in deployments(rig),
        150, f"promotion (now {canary(rig).get('message')})")  # fmt: skip
    assert promoted
    final = status(rig)
    assert final["revision"] == new
    assert final["stableSpec"]["deploymentRevision"] == new
    assert list(deployments(rig)) == [name]
    assert deployments(rig)[name]["spec"]["replicas"] == 2
    wait_endpoints(rig.kube, rig.ns, "chat-unified", 2)
    assert not rig.kube.ok("get", "service", name, "-n", rig.ns)
    reasons = [reason for _, reason, _ in events(rig) if reason.startswith("Canary")]
    for wanted in ("CanaryStarted", "CanaryStep", "CanaryPromoting", "CanaryPromoted"):
        assert wanted in reasons
    assert condition(rig.kube, rig.ns, "chat", "Ready")["status"] == "True"
    assert condition(rig.kube, rig.ns, "chat", "CanaryInProgress")["status"] == "False"
    assert old != new
    text = rig.operator.text()
    assert f"canary {new} step 1 (weight 50%): Pass:" in text


def test_too_few_requests_wait_prometheus_down_holds_a_slow_canary_rolls_back(rig: Rig) -> None:
    start(rig)
    new = change(rig, "2", FEW)
    name = L.revision_child_name("chat", "unified", new)
    waiting = rig.kube.wait_for(lambda: in_progress(rig, "WaitingForSamples"), 60,
                                "the rollout to wait for samples")  # fmt: skip
    assert "of the 20 requests a verdict needs" in waiting["message"]
    assert waiting["step"] == 0

    rig.prometheus.stop()
    held = rig.kube.wait_for(lambda: in_progress(rig, "AnalysisUnavailable"), 30,
                             "the rollout to hold")  # fmt: skip
    assert "holding, no verdict without metrics" in held["message"]
    assert (held["phase"], held["step"]) == ("Progressing", 0)

    rig.prometheus.start()
    rig.prometheus.set_targets([], exporters=[Target(f"127.0.0.1:{rig.exporter.port}")])
    rig.exporter.revisions[new] = SLOW
    rolled = rig.kube.wait_for(lambda: canary_if(rig, lambda c: c.get("phase") == "RolledBack"),
                               90, "the rollback")  # fmt: skip
    assert rolled["weight"] == 0
    assert rolled["failedRevision"] == new
    degraded = condition(rig.kube, rig.ns, "chat", "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "CanaryRolledBack")
    assert "ITL p95 of the canary" in degraded["message"]
    assert "stable revision's" in degraded["message"]
    warnings = [m for kind, reason, m in events(rig)
                if (kind, reason) == ("Warning", "CanaryRolledBack")]  # fmt: skip
    assert len(warnings) == 1
    rig.kube.wait_for(lambda: name not in deployments(rig), 60, "the canary's Deployment to go")
    assert not rig.kube.ok("get", "service", name, "-n", rig.ns)
    wait_endpoints(rig.kube, rig.ns, "chat-unified", 2)
    assert condition(rig.kube, rig.ns, "chat", "Ready")["status"] == "True"
    # Not tried again while the spec asks for it.
    time.sleep(6)
    assert canary(rig)["phase"] == "RolledBack"
    assert list(deployments(rig)) == ["chat-unified"]
