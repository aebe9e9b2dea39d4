"""The local cluster's audit log (pure): off unless asked for; when on, every request at
level Metadata into a bounded file under the cluster's state directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmfleet.core.cluster.local import (
    AUDIT_LOG_BACKUPS,
    AUDIT_LOG_MAX_MB,
    AUDIT_POLICY,
    ClusterSpec,
    LocalCluster,
    kwokctl_config,
)
from llmfleet.core.cluster.nodes import NodePool

AUDIT_FLAGS = {
    "audit-policy-file",
    "audit-log-path",
    "audit-log-format",
    "audit-log-maxsize",
    "audit-log-maxbackup",
}


def _apiserver_args(audit_log: bool, audit: Path | None) -> dict[str, str]:
    spec = ClusterSpec("c", (NodePool("H100", 1),), 6443, audit_log=audit_log)
    rendered = kwokctl_config(spec, LocalCluster.binaries(), None, audit)
    (apiserver,) = (p for p in rendered["componentsPatches"] if p["name"] == "kube-apiserver")
    return {arg["key"]: arg["value"] for arg in apiserver["extraArgs"]}


@pytest.mark.parametrize("audit", [None, Path("/state/audit")], ids=["no-dir", "dir-given"])
def test_off_by_default_whatever_directory_is_given(audit: Path | None) -> None:
    assert not AUDIT_FLAGS & set(_apiserver_args(False, audit))


def test_on_it_writes_json_under_the_state_directory_rotated_at_a_bound() -> None:
    args = _apiserver_args(True, Path("/state/audit"))
    assert {key: args[key] for key in AUDIT_FLAGS} == {
        "audit-policy-file": "/state/audit/policy.yaml",
        "audit-log-path": "/state/audit/audit.log",
        "audit-log-format": "json",
        "audit-log-maxsize": str(AUDIT_LOG_MAX_MB),
        "audit-log-maxbackup": str(AUDIT_LOG_BACKUPS),
    }
    assert AUDIT_LOG_MAX_MB * (AUDIT_LOG_BACKUPS + 1) <= 1024


def test_the_policy_logs_every_request_once_complete_without_bodies() -> None:
    assert AUDIT_POLICY["omitStages"] == ["RequestReceived"]
    # One catch-all rule: no request is left out, none is logged with its body.
    assert AUDIT_POLICY["rules"] == [{"level": "Metadata"}]


def test_the_cluster_keeps_its_log_in_its_own_state_directory() -> None:
    cluster = LocalCluster("c", state=Path("/state"))
    assert cluster.audit_log == Path("/state/clusters/c/audit/audit.log")
    assert cluster.audit_log.parent == cluster.audit_dir


@pytest.mark.parametrize("audit_log", [False, True], ids=["off", "on"])
def test_the_spec_remembers_it_and_older_specs_read_as_off(audit_log: bool) -> None:
    spec = ClusterSpec("c", (NodePool("H100", 1),), 6443, audit_log=audit_log)
    assert ClusterSpec.from_json(spec.to_json()) == spec
    older = '{"name": "c", "pools": [{"gpu_type": "H100", "nodes": 1}], "port": 6443}'
    assert ClusterSpec.from_json(older).audit_log is False
