"""The chart's monitoring objects as helm renders them (templates/monitoring/): PodMonitors for
the components, PrometheusRules from files/rules/, dashboard ConfigMaps from files/dashboards/,
and their values (monitoring.*)."""

from __future__ import annotations

import json
from typing import Any

import yaml

from tests.chart import helm
from tests.chart.monitoring import DASHBOARDS, RULE_FILES

MONITORING = "monitoring.coreos.com/v1"


def render(values: dict[str, Any] | None = None, api: bool = True) -> list[dict[str, Any]]:
    return helm.template(values, api_versions=[MONITORING] if api else [])


def test_prometheus_operator_objects_only_where_its_api_exists() -> None:
    without = render(api=False)
    assert not helm.find(without, "PodMonitor")
    assert not helm.find(without, "PrometheusRule")
    assert len(helm.find(render(), "PodMonitor")) == 3
    assert len(helm.find(render(), "PrometheusRule")) == len(RULE_FILES)


def test_each_component_is_scraped_on_its_metrics_port_with_its_own_labels() -> None:
    docs = render()
    for component, port in (
        ("operator", "metrics"),
        ("autoscaler", "metrics"),
        ("gateway", "admin"),  # the admin routes have a port of their own by default
    ):
        (monitor,) = helm.find(docs, "PodMonitor", f"t-llmfleet-{component}")
        pod = helm.deployment(docs, component)["spec"]["template"]
        container_ports = {p["name"] for p in pod["spec"]["containers"][0]["ports"]}
        assert monitor["metadata"]["labels"]["app.kubernetes.io/component"] == component
        assert monitor["spec"]["namespaceSelector"] == {"matchNames": [helm.NAMESPACE]}
        selector = monitor["spec"]["selector"]["matchLabels"]
        assert selector.items() <= pod["metadata"]["labels"].items()
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        assert endpoint["port"] == port
        assert port in container_ports
        assert endpoint["path"] == "/metrics"
        # The components' namespace/service/pool labels must win over the target's.
        assert endpoint["honorLabels"] is True


def test_the_gateway_is_scraped_on_its_api_port_without_an_admin_port() -> None:
    docs = render({"gateway.settings.adminPort": None})
    (monitor,) = helm.find(docs, "PodMonitor", "t-llmfleet-gateway")
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "http"


def test_the_gateway_is_scraped_on_its_admin_port_once_it_has_one() -> None:
    docs = render({"gateway.settings": {"host": "0.0.0.0", "adminPort": 9100}})
    (monitor,) = helm.find(docs, "PodMonitor", "t-llmfleet-gateway")
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "admin"
    container = helm.deployment(docs, "gateway")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "admin", "containerPort": 9100, "protocol": "TCP"} in container["ports"]


def test_monitor_labels_for_the_prometheus_selector() -> None:
    docs = render({"monitoring.serviceMonitors.labels": {"release": "kube-prometheus-stack"}})
    for monitor in helm.find(docs, "PodMonitor"):
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_components_without_metrics_get_no_monitor() -> None:
    docs = render({"autoscaler.enabled": False, "operator.metricsPort": 0})
    names = {doc["metadata"]["name"] for doc in helm.find(docs, "PodMonitor")}
    assert names == {"t-llmfleet-gateway"}
    assert not helm.find(render({"monitoring.serviceMonitors.enabled": False}), "PodMonitor")


def test_prometheus_rules_carry_the_rule_files_as_they_are() -> None:
    docs = render({"monitoring.rules.labels": {"release": "kube-prometheus-stack"}})
    for path in RULE_FILES:
        (rule,) = helm.find(docs, "PrometheusRule", f"t-llmfleet-{path.stem}")
        assert rule["spec"] == yaml.safe_load(path.read_text())
        assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        assert rule["metadata"]["namespace"] == helm.NAMESPACE
    assert not helm.find(render({"monitoring.rules.enabled": False}), "PrometheusRule")


def test_dashboards_are_configmaps_for_grafanas_sidecar() -> None:
    docs = render(api=False)
    for path in DASHBOARDS:
        (config,) = helm.find(docs, "ConfigMap", f"t-llmfleet-dashboard-{path.stem}")
        assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert config["metadata"]["namespace"] == helm.NAMESPACE
        (text,) = config["data"].values()
        assert json.loads(text) == json.loads(path.read_text())
    moved = render({"monitoring.dashboards.namespace": "grafana",
                    "monitoring.dashboards.labels": {"team": "ml"}}, api=False)  # fmt: skip
    for config in helm.find(moved, "ConfigMap"):
        if config["metadata"]["name"].startswith("t-llmfleet-dashboard-"):
            assert config["metadata"]["namespace"] == "grafana"
            assert config["metadata"]["labels"]["team"] == "ml"
            assert config["metadata"]["labels"]["grafana_dashboard"] == "1"  # values merge
    off = render({"monitoring.dashboards.enabled": False}, api=False)
    assert not [c for c in helm.find(off, "ConfigMap") if "dashboard" in c["metadata"]["name"]]
