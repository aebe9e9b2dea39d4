"""bench/_audit.py: the API server's audit log read into requests per second by component,
verb and resource (the scale benchmark's by-component table)."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from llmfleet.core.kube import user_agent
from tests.unit.bench_modules import load

audit = load("_audit")

T0 = datetime(2026, 11, 28, 3, 0, 0, tzinfo=UTC)
KCM = "kube-controller-manager/v1.36.3 (linux/amd64) kubernetes/0000000/deployment-controller"


def _event(
    agent: str = "kubectl/v1.36.3 (linux/amd64) kubernetes/0000000",
    verb: str = "get",
    at: str = "2026-11-28T03:00:01.000000Z",
    audit_id: str = "a",
    stage: str = "ResponseComplete",
    **ref: str,
) -> str:
    event: dict[str, Any] = {
        "kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata",
        "auditID": audit_id, "stage": stage, "verb": verb, "userAgent": agent,
        "requestURI": "/api/v1/pods?limit=500", "requestReceivedTimestamp": at,
        "stageTimestamp": at,
    }  # fmt: skip
    if ref:
        event["objectRef"] = ref
    return json.dumps(event)


@pytest.mark.parametrize(
    ("agent", "component"),
    [
        (user_agent("operator"), "llmfleet-operator"),
        (user_agent("gateway"), "llmfleet-gateway"),
        (user_agent("autoscaler"), "llmfleet-autoscaler"),
        (KCM, "kube-controller-manager"),
        ("kube-scheduler/v1.36.3 (linux/amd64) kubernetes/0000000/scheduler", "kube-scheduler"),
        ("kube-apiserver/v1.36.3 (linux/amd64) kubernetes/0000000", "kube-apiserver"),
        ("kwok-controller/v0.8.0 (linux/amd64)", "kwok-controller"),
        ("kubectl/v1.36.3 (linux/amd64) kubernetes/0000000", "kubectl"),
        ("kopf/1.45.2", "kopf (unnamed)"),
        ("OpenAPI-Generator/37.0.2/python", "python client (unnamed)"),
        ("curl/8.5.0", "other"),
        ("", "other"),
    ],
    ids=lambda value: value.split("/")[0] or "empty",
)
def test_each_user_agent_names_its_component(agent: str, component: str) -> None:
    assert audit.component_of(agent) == component


@pytest.mark.parametrize(
    ("ref", "resource"),
    [
        ({"resource": "pods", "namespace": "n", "name": "p"}, "pods"),
        ({"resource": "pods", "subresource": "status", "name": "p"}, "pods/status"),
        ({"resource": "inferenceservices", "apiGroup": "llmfleet.dev"}, "inferenceservices"),
        ({}, "/api/v1/pods"),  # no objectRef: the path, without its query
    ],
    ids=["resource", "subresource", "custom-resource", "non-resource"],
)
def test_the_resource_carries_its_subresource_or_else_the_path(
    ref: dict[str, str], resource: str
) -> None:
    event = json.loads(_event(verb="list", **ref))
    assert audit.key_of(event) == ("kubectl", "list", resource)


def _count(*lines: str) -> dict[tuple[str, str, str], int]:
    end = T0.replace(second=10)
    return dict(audit.counts(lines, T0, end))


PODS = {"resource": "pods"}


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ([_event(**PODS), _event(audit_id="b", **PODS)], {("kubectl", "get", "pods"): 2}),
        # A watch logs ResponseStarted, then ResponseComplete when it ends: one request.
        (
            [_event(verb="watch", stage="ResponseStarted", **PODS), _event(verb="watch", **PODS)],
            {("kubectl", "watch", "pods"): 1},
        ),
        # Counted by arrival: [start, end), whenever it completed.
        (
            [
                _event(at="2026-11-28T03:00:00.000000Z", audit_id="first", **PODS),
                _event(at="2026-11-28T03:00:10.000000Z", audit_id="at-end", **PODS),
                _event(at="2026-11-28T02:59:59.999999Z", audit_id="before", **PODS),
            ],
            {("kubectl", "get", "pods"): 1},
        ),
        # A line cut by rotation, a line that is no event: skipped.
        (['{"auditID": "x", "verb"', "{}", _event(**PODS)], {("kubectl", "get", "pods"): 1}),
        (
            [
                _event(
                    agent=user_agent("operator"),
                    verb="patch",
                    audit_id="p",
                    resource="inferenceservices",
                    subresource="status",
                ),
                _event(agent=KCM, verb="update", audit_id="u", resource="leases"),
            ],
            {
                ("llmfleet-operator", "patch", "inferenceservices/status"): 1,
                ("kube-controller-manager", "update", "leases"): 1,
            },
        ),
    ],
    ids=["two-gets", "watch-once", "window-bounds", "bad-lines", "by-component"],
)
def test_requests_are_counted_once_by_arrival_in_the_window(
    lines: list[str], expected: dict[tuple[str, str, str], int]
) -> None:
    assert _count(*lines) == expected


def test_rates_read_the_rotated_copies_written_during_the_window(tmp_path: Path) -> None:
    start, end = T0.timestamp(), T0.timestamp() + 10
    log = tmp_path / "audit.log"
    rotated = tmp_path / "audit-2026-11-28T03-00-05.000.log"
    stale = tmp_path / "audit-2026-11-28T02-00-00.000.log"
    rotated.write_text(_event(audit_id="r", **PODS) + "\n")
    log.write_text(_event(audit_id="l", **PODS) + "\n")
    # Last written before the window: not even opened (it would count too if it were).
    stale.write_text(_event(audit_id="s", **PODS) + "\n")
    os.utime(stale, (start - 60, start - 60))
    for path in (log, rotated):
        os.utime(path, (start + 5, start + 5))
    assert audit.log_files(log, start) == [rotated, log]
    assert audit.read_rates(log, start, end) == {("kubectl", "get", "pods"): 0.2}


def test_the_table_sums_each_components_writes_and_reads() -> None:
    columns = {
        "plain": {("kubectl", "get", "pods"): 1.0},
        "operator": {
            ("llmfleet-operator", "patch", "inferenceservices/status"): 2.0,
            ("llmfleet-operator", "watch", "pods"): 0.5,
            ("kubectl", "get", "pods"): 1.0,
        },
    }
    rows = {line[:70].strip(): line[70:].split() for line in audit.table(columns)[1:]}
    assert rows["llmfleet-operator: all writes"] == ["0.00", "2.00"]
    assert rows["llmfleet-operator: all reads"] == ["0.00", "0.50"]
    assert rows["kubectl: all reads"] == ["1.00", "1.00"]
    assert rows["llmfleet-operator patch inferenceservices/status"] == ["0.00", "2.00"]


def test_without_an_audit_log_the_section_says_so(tmp_path: Path) -> None:
    for log in (None, tmp_path / "audit.log"):
        (line,) = audit.section(log, {"plain": (0.0, 1.0)})
        assert "no audit log" in line
