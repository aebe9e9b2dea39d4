"""The local cluster's opt-in audit log, on a second cluster: a request shows up in it once,
with the User-Agent of whoever sent it (the scale benchmark's by-component table reads it)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from llmfleet.core.cluster import LocalCluster
from llmfleet.core.kube import api_client, user_agent
from tests.cluster.kube import Kube
from tests.net import require_isolation

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    require_isolation()
    cluster = LocalCluster("llmfleet-audit", state=tmp_path_factory.mktemp("audit-state"))
    cluster.up(node_count=1, gpus_per_node=1, gpu_type="H100", audit_log=True)
    try:
        yield cluster
    finally:
        cluster.down()


def _events(log: Path) -> list[dict[str, Any]]:
    """The audit log's events so far; a last line the API server is still writing is left
    for the next read."""
    text = log.read_text()
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines()]


def test_a_components_request_is_logged_with_its_user_agent(audited: LocalCluster) -> None:
    api = api_client(str(audited.kubeconfig), component="gateway")
    client.CoreV1Api(api).read_namespace("default")

    def logged() -> list[dict[str, Any]]:
        return [
            event for event in _events(audited.audit_log)
            if event.get("userAgent") == user_agent("gateway")
        ]  # fmt: skip

    (event,) = Kube.wait_for(logged, 30, "the gateway's GET in the audit log")
    assert event["stage"] == "ResponseComplete"
    assert event["level"] == "Metadata"
    assert (event["verb"], event["objectRef"]["resource"]) == ("get", "namespaces")
    assert "requestObject" not in event
    assert "responseObject" not in event
