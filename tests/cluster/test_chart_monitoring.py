"""The chart's PodMonitors and PrometheusRules on the real API server, with the Prometheus
Operator's own CRDs (v0.93.0, tests/chart/prometheus-operator-crds/) installed for the test and
removed after it: a server-side dry run with strict field validation accepts every object the
chart renders, defaults and every option on, and refuses a misspelt field."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart import helm
from tests.cluster.kube import Kube

pytestmark = pytest.mark.cluster

CRDS = Path(__file__).parents[1] / "chart" / "prometheus-operator-crds"
MONITORING = "monitoring.coreos.com/v1"
KINDS = {"PodMonitor", "PrometheusRule"}


@pytest.fixture
def prometheus_operator_crds(kube: Kube) -> Iterator[None]:
    """The two CRDs, Established; deleted afterwards (the operator renders ServiceMonitors where
    monitoring.coreos.com exists, and other tests expect it not to)."""
    names = []
    for path in sorted(CRDS.glob("*.yaml")):
        names.append(yaml.safe_load(path.read_text())["metadata"]["name"])
        kube.kubectl("apply", "--server-side", "-f", str(path))
    try:
        for name in names:
            kube.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")
        yield
    finally:
        for name in names:
            kube.run("delete", "crd", name, "--wait=true")


def _dry_run(kube: Kube, docs: list[dict[str, Any]], path: Path) -> str:
    path.write_text(yaml.safe_dump_all(docs))
    return kube.kubectl("apply", "--dry-run=server", "--validate=strict", "-f", str(path))


@pytest.mark.parametrize("files", [[], [helm.VALUES_FULL]], ids=["defaults", "values-full"])
def test_the_api_server_accepts_the_monitoring_objects(
    kube: Kube,
    namespace: str,
    prometheus_operator_crds: None,
    tmp_path: Path,
    files: list[Path],
) -> None:
    docs = helm.template(files=files, namespace=namespace, api_versions=[MONITORING])
    monitoring = [doc for doc in docs if doc["kind"] in KINDS]
    assert {doc["kind"] for doc in monitoring} == KINDS
    out = _dry_run(kube, monitoring, tmp_path / "monitoring.yaml")
    for doc in monitoring:
        name = f"{doc['kind'].lower()}.monitoring.coreos.com/{doc['metadata']['name']}"
        assert f"{name} created (server dry run)" in out


def test_the_api_server_refuses_a_misspelt_field(
    kube: Kube, namespace: str, prometheus_operator_crds: None, tmp_path: Path
) -> None:
    """The dry run has teeth: the CRD's schema refuses what the Prometheus Operator would not
    read."""
    docs = helm.template(namespace=namespace, api_versions=[MONITORING])
    monitor = copy.deepcopy(next(doc for doc in docs if doc["kind"] == "PodMonitor"))
    endpoint = monitor["spec"]["podMetricsEndpoints"][0]
    endpoint["honourLabels"] = endpoint.pop("honorLabels")
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(monitor))
    result = kube.run("apply", "--dry-run=server", "--validate=strict", "-f", str(path))
    assert result.returncode != 0
    assert "honourLabels" in result.stderr
