"""An idle operator is silent at the API server and runs no pass between its full resyncs
(issue 28): once its services have converged, resync periods pass without a pass (counted on
its reconcile histogram), and the full resyncs write nothing, list no pod or child and read no
service (those come from its watches), counted by the API server itself
(`apiserver_request_total` by verb, resource and subresource), not by the operator. On the way
it reads the steps of the operator's start (`llmfleet_operator_start_seconds`), and at the end
it stops the operator, whose service loops must end by themselves (`handlers.py`)."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cluster.api_counts import api_requests, since
from tests.cluster.kube import Kube, install_crds, wait_endpoints, wait_ready
from tests.cluster.operator_process import OperatorProcess, passes, start_steps
from tests.net import free_port

pytestmark = pytest.mark.cluster

NAMESPACE = f"idle-{os.getpid() % 10000}"
RESYNC_SECONDS = 2.0
FULL_RESYNC_SECONDS = 16.0
"""A service's full resync comes 8-16 s after its last pass (`pacing.py`)."""
WRITES = frozenset({"POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"})
OPERATOR_WRITES = frozenset(
    {
        ("inferenceservices", ""),
        ("inferenceservices", "status"),
        ("deployments", ""),
        ("services", ""),
        ("configmaps", ""),
        ("poddisruptionbudgets", ""),
        ("networkpolicies", ""),
        ("pods", ""),
    }
)
"""(resource, subresource) the operator writes, but for Events (`operator_events`). Nothing
else in the test cluster writes these while nothing changes (the controller-manager writes
Deployments' and budgets' `status` subresource, and only on a change; kwok heartbeats nodes and
leases)."""

CHILD_READS = frozenset(
    {
        ("pods", ""),
        ("deployments", ""),
        ("services", ""),
        ("configmaps", ""),
        ("poddisruptionbudgets", ""),
        ("networkpolicies", ""),
        ("servicemonitors", ""),
        ("endpointslices", ""),
    }
)
"""What a pass read of a service's world besides the service itself, each by a LIST (it never
GETs one of them). The cluster's own controllers list these only when their watches start, so
nothing else LISTs them while nothing changes. (GETs of single objects are no sign: the API
server itself GETs the `kubernetes` Service's Endpoints and EndpointSlice every 10 s, and its
count does not say who asked.)"""
READS = frozenset({"GET", "LIST"})
READ_RESOURCES = CHILD_READS | {("inferenceservices", "")}


def api_writes(kube: Kube) -> Counter[tuple[str, str, str]]:
    """(verb, resource, subresource) -> requests the API server has counted so far, for the
    writes of `OPERATOR_WRITES`."""
    return api_requests(kube, WRITES, OPERATOR_WRITES)


def operator_events(kube: Kube) -> int:
    """Events the operator has posted in the test's namespace, repeats included, as the API
    server holds them (other components post Events too, in other namespaces)."""
    items = kube.get("events", "-n", NAMESPACE)["items"]
    return sum(
        item.get("count") or 1
        for item in items
        if (item.get("source") or {}).get("component") == "llmfleet-operator"
    )


@dataclass(frozen=True)
class Operator:
    process: OperatorProcess
    port: int
    """Its metrics port."""


@pytest.fixture
def operator(kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    """An operator watching a namespace of its own."""
    install_crds(kube)
    kube.kubectl("create", "namespace", NAMESPACE)
    port = free_port()
    log: Path = tmp_path_factory.mktemp("operator") / "operator.log"
    process = OperatorProcess(
        kube, log, "--standalone", "-n", NAMESPACE,
        env={"LLMFLEET_OPERATOR_RESYNC_SECONDS": str(RESYNC_SECONDS),
             "LLMFLEET_OPERATOR_FULL_RESYNC_SECONDS": str(FULL_RESYNC_SECONDS),
             "LLMFLEET_OPERATOR_METRICS_PORT": str(port)},
    )  # fmt: skip
    try:
        yield Operator(process, port)
    finally:
        process.stop()
        print(process.text()[-3000:])
        kube.kubectl("delete", "namespace", NAMESPACE, "--timeout=120s")


SERVICES = {
    "unified": {"mode": "Unified", "unified": {"replicas": 2}},
    "split": {"mode": "Disaggregated", "prefill": {"replicas": 1}, "decode": {"replicas": 1},
              "kvTransfer": {"connector": "NixlConnector"}},
}  # fmt: skip


def test_an_idle_operator_passes_only_at_full_resyncs_which_write_nothing(
    kube: Kube, operator: Operator
) -> None:
    at_start = api_writes(kube)
    for name, topology in SERVICES.items():
        service = {
            "apiVersion": "llmfleet.dev/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": name},
            "spec": {"model": {"name": f"org/{name}"},
                     "runtime": {"gpu": {"type": "H100", "count": 1}}, "topology": topology},
        }  # fmt: skip
        kube.kubectl("create", "-n", NAMESPACE, "-f", "-", stdin=json.dumps(service))
    for name, topology in SERVICES.items():
        wait_ready(kube, NAMESPACE, name)
        for pool in ("unified", "prefill", "decode"):
            if pool in topology:
                wait_endpoints(kube, NAMESPACE, f"{name}-{pool}", topology[pool]["replicas"])
    # What the start took, from the process's start: every step, in the order they come (the
    # metrics are served before kopf starts the watches, and a pass waits for their LISTs).
    steps = start_steps(operator.port)
    assert set(steps) == {"serving", "listed", "first_pass"}, steps
    assert 0 < steps["serving"] < steps["listed"] <= steps["first_pass"], steps
    print(f"the operator's start [s]: {steps}")
    # Converged: two more passes have seen the ready endpoints.
    settled = passes(operator.port) + 2
    kube.wait_for(lambda: passes(operator.port) >= settled, 60, "two passes after Ready")

    # The count sees the operator's writes: converging took one apply per Deployment at least.
    applied = (
        api_writes(kube)[("APPLY", "deployments", "")] - at_start[("APPLY", "deployments", "")]
    )
    assert applied >= 3, f"{applied} Deployment applies counted for 3 Deployments"
    events = operator_events(kube)
    assert events > 0, "the operator's Events are not where this test counts them"
    reads_before = api_requests(kube, READS, READ_RESOURCES)
    before, passes_before, started = api_writes(kube), passes(operator.port), time.monotonic()
    # Resync periods that end with nothing changed run no pass: over three of them, at most
    # the full resyncs that fell due (one per service per half period; the loop before issue
    # 28 ran a pass of each service in each).
    kube.wait_for(lambda: time.monotonic() - started > 3 * RESYNC_SECONDS, 30, "three periods")
    idle_passes, elapsed = passes(operator.port) - passes_before, time.monotonic() - started
    full_resyncs = len(SERVICES) * (1 + int(elapsed // (FULL_RESYNC_SECONDS / 2)))
    print(f"passes over {elapsed:.1f} s idle: {idle_passes} (full resyncs due: {full_resyncs})")
    assert idle_passes <= full_resyncs, f"{idle_passes} passes in {elapsed:.1f} s idle"
    # The full resyncs come, two of each service, and write nothing.
    kube.wait_for(lambda: passes(operator.port) >= passes_before + 2 * len(SERVICES),
                  4 * FULL_RESYNC_SECONDS, "two full resyncs of every service")  # fmt: skip
    after = api_writes(kube)
    written = since(before, after)
    print(f"passes in the window: {passes(operator.port) - passes_before}; writes: {written}")
    reads = since(reads_before, api_requests(kube, READS, READ_RESOURCES))
    print(f"reads in the window: {reads}")
    assert written == {}, f"the idle operator wrote (verb, resource, subresource): {written}"
    assert operator_events(kube) == events, "the idle operator posted Events"
    # The API server counts every client: the control plane's own informers, or a watch of the
    # operator's that expired, may LIST once (CI saw one LIST of services). A read per pass
    # counts at least one per pass in the window.
    window_passes = passes(operator.port) - passes_before
    services = {key: n for key, n in reads.items() if key[1] == "inferenceservices"}
    per_pass = {key: n for key, n in services.items() if n >= window_passes}
    assert per_pass == {}, f"idle passes read their services at the API server: {services}"
    listed = {key: n for key, n in reads.items() if key[0] == "LIST" and key[1:] in CHILD_READS}
    per_pass = {key: n for key, n in listed.items() if n >= window_passes}
    assert per_pass == {}, f"idle passes listed pods or children at the API server: {listed}"

    # Stopped, its service loops end by themselves: kopf cancels none (it would log "... is
    # cancelled. Will escalate." for each), and the process exits before `stop` kills it.
    operator.process.stop()
    assert operator.process.process.returncode != -signal.SIGKILL, "killed: it did not stop"
    cancelled = [line for line in operator.process.text().splitlines() if "is cancelled" in line]
    assert cancelled == [], f"kopf cancelled service loops at the stop: {cancelled}"
