"""The chart's Grafana dashboards (charts/llmfleet/files/dashboards/).

No Grafana can be installed here (it is packaged neither for Debian's archive nor for PyPI), so
the dashboards are checked against Grafana's own JSON schemas for the dashboard model, its panel
plugins and Prometheus queries (tests/chart/grafana-schema/, Grafana 11.6), every query is parsed
by promtool, and every query runs against a real Prometheus that scrapes a real gateway in front
of simulator engines, a dcgm-exporter stand-in and the autoscaler's and operator's own metric
registries, with the chart's recording rules loaded: the panels that these sources feed must
show data.
"""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema_rs
import pytest
import yaml
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from llmfleet.autoscaler.metrics import AutoscalerMetrics
from llmfleet.gateway.discovery import StaticDiscovery, parse_static_config
from llmfleet.operator.metrics import OperatorMetrics
from tests.autoscaler.prom import EngineSpec, Prometheus, Target, engines
from tests.chart.monitoring import (
    DASHBOARDS,
    RULE_FILES,
    Query,
    as_prometheus_sees_it,
    load_dashboard,
    panels,
    promtool,
    queries,
)
from tests.gateway.servers import gateway
from tests.net import wait_for

SCHEMAS = Path(__file__).with_name("grafana-schema")
PANEL_TYPES = {"timeseries", "stat"}


def _validator(name: str, definition: str | None = None) -> jsonschema_rs.Draft7Validator:
    schema: dict[str, Any] = json.loads((SCHEMAS / f"{name}.jsonschema.json").read_text())
    if definition is not None:
        schema = {"$ref": f"#/definitions/{definition}", "definitions": schema["definitions"]}
    return jsonschema_rs.Draft7Validator(schema)


def _errors(validator: jsonschema_rs.Draft7Validator, instance: Any, where: str) -> list[str]:
    return [
        f"{where}/{'/'.join(map(str, error.instance_path))}: {error.message[:200]}"
        for error in validator.iter_errors(instance)
    ]


def schema_errors(dashboard: dict[str, Any]) -> list[str]:
    """What Grafana's schemas refuse in a dashboard: the dashboard model, each panel's options
    and custom field config for its plugin, each query target of the Prometheus data source."""
    errors = _errors(_validator("dashboard"), dashboard, "dashboard")
    target = _validator("prometheus")
    for panel in panels(dashboard):
        where = f"panel {panel.get('title')!r}"
        if panel["type"] == "row":
            continue
        if panel["type"] not in PANEL_TYPES:
            errors.append(f"{where}: type {panel['type']} has no schema here")
            continue
        errors += _errors(_validator(panel["type"], "Options"), panel["options"], where)
        custom = panel["fieldConfig"]["defaults"].get("custom")
        if custom is not None:
            errors += _errors(_validator(panel["type"], "FieldConfig"), custom, where)
        for query in panel["targets"]:
            errors += _errors(target, query, f"{where} target {query.get('refId')}")
    return errors


@pytest.fixture(params=DASHBOARDS, ids=lambda path: path.name)
def dashboard(request: pytest.FixtureRequest) -> dict[str, Any]:
    return load_dashboard(request.param)


def test_the_chart_ships_the_fleet_and_the_service_dashboards() -> None:
    found = {path.name: load_dashboard(path) for path in DASHBOARDS}
    assert {name: d["uid"] for name, d in found.items()} == {
        "fleet.json": "llmfleet-fleet",
        "service.json": "llmfleet-service",
    }
    for d in found.values():
        assert "llmfleet" in d["tags"]
        assert d["title"].startswith("llmfleet / ")


def test_dashboards_match_grafanas_schemas(dashboard: dict[str, Any]) -> None:
    assert schema_errors(dashboard) == []


def test_the_schemas_refuse_what_grafana_would_not_read() -> None:
    """The check has teeth: a misspelt field, a wrong type and an unknown legend mode fail."""
    broken = load_dashboard(DASHBOARDS[0])
    index, first = next(
        (index, panel)
        for index, panel in enumerate(broken["panels"])
        if panel["type"] == "timeseries"
    )
    first["gridPos"]["w"] = "wide"
    first["targets"][0]["exprs"] = first["targets"][0].pop("expr")
    first["options"]["legend"]["displayMode"] = "sideways"
    errors = "\n".join(schema_errors(broken))
    assert f"dashboard/panels/{index}: " in errors  # the panel is neither a Panel nor a RowPanel
    assert "'exprs' was unexpected" in errors
    assert "sideways" in errors
    assert load_dashboard(DASHBOARDS[0]) != broken


def test_panels_tile_the_grid_and_say_what_they_show(dashboard: dict[str, Any]) -> None:
    ids = [panel["id"] for panel in panels(dashboard)]
    assert len(ids) == len(set(ids))
    taken: set[tuple[int, int]] = set()
    for panel in panels(dashboard):
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        cells = {
            (grid["x"] + dx, grid["y"] + dy) for dx in range(grid["w"]) for dy in range(grid["h"])
        }
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells
        if panel["type"] == "row":
            continue
        assert panel["title"], panel
        assert panel["description"], panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]


def test_every_query_parses(tmp_path: Path) -> None:
    """promtool parses each query (Grafana's variables filled in as Grafana sends them) as a
    recording rule's expression."""
    found = [query for path in DASHBOARDS for query in queries(path)]
    assert len(found) > 40
    rules = [
        {"record": f"dashboard_query_{index}", "expr": as_prometheus_sees_it(query.expr)}
        for index, query in enumerate(found)
    ]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    command = [str(promtool()), "check", "rules", str(path)]
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


# --- the queries against a real Prometheus ----------------------------------------------------

NAMESPACE, SERVICE = "ml", "chat"
LATENCY = ("--time-to-first-token", "40ms", "--inter-token-latency", "10ms", "--enable-kvcache")
WITH_DATA = {
    "fleet.json": {
        "Requests/s", "5xx", "GPU utilisation", "Scaling limited", "Requests/s by service",
        "Errors and 429s by service", "Serving replicas", "KV cache usage by pool",
        "Queued requests by pool", "GPU utilisation by pool", "Gateway overhead p99",
        "Operator reconcile", "Autoscaler",
    },
    "service.json": {
        "Requests/s", "TTFT p95", "ITL p95", "5xx", "Time to first token", "Inter-token latency",
        "Engine TTFT p95 by pool", "Engine ITL p95 by pool", "Requests/s by outcome",
        "Tokens/s by pool", "Replicas", "KV cache usage", "Queue", "GPU utilisation",
        "GPU memory", "GPU temperature", "Gateway overhead",
    },
}  # fmt: skip
"""Panels the fixture feeds: everything but the operator's pending metrics (SLO targets, pool
counts, conditions: tests/chart/metrics/pending.txt), preemptions (the simulator counts none) and
the traffic policies (none configured)."""


class ChartPrometheus(Prometheus):
    """The tests' Prometheus (1 s scrapes and rule evaluations) with the chart's rules."""

    def _config(self) -> dict[str, object]:
        config = super()._config()
        config["rule_files"] = [str(path) for path in RULE_FILES]
        return config


@contextlib.contextmanager
def serving(registry: CollectorRegistry) -> Iterator[Target]:
    """A registry's /metrics on 127.0.0.1 (a stand-in exporter), as a scrape target."""
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        yield Target(f"127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def dcgm_standin(pods: list[str]) -> CollectorRegistry:
    """dcgm-exporter in Kubernetes mode: one GPU per engine pod, labelled with the pod."""
    registry = CollectorRegistry()
    labels = ("gpu", "UUID", "Hostname", "namespace", "pod")
    fields = {"DCGM_FI_DEV_GPU_UTIL": 63, "DCGM_FI_DEV_FB_USED": 72000,
              "DCGM_FI_DEV_FB_FREE": 8000, "DCGM_FI_DEV_GPU_TEMP": 61}  # fmt: skip
    for name, value in fields.items():
        gauge = Gauge(name, name, labels, registry=registry)
        for index, pod in enumerate(pods):
            gauge.labels("0", f"GPU-{index}", "node-1", NAMESPACE, pod).set(value)
    return registry


class ControlPlane:
    """The operator's and the autoscaler's own registries, passing and deciding while `run`s."""

    def __init__(self) -> None:
        self.operator = OperatorMetrics()
        self.autoscaler = AutoscalerMetrics()
        self.autoscaler.desired_replicas.labels(NAMESPACE, SERVICE, "unified").set(2)
        self.autoscaler.desired_spares.labels(NAMESPACE, SERVICE, "unified").set(1)
        self.autoscaler.limited.labels(NAMESPACE, SERVICE).set(0)
        self.autoscaler.signals_missing.labels(NAMESPACE, SERVICE, "unified", "no-series")
        self.registries = [self.operator.registry, self.autoscaler.registry]

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(0.2):
            self.operator.reconcile_seconds.labels(NAMESPACE, SERVICE, "ok").observe(0.02)
            self.autoscaler.pass_seconds.labels("full").observe(0.05)


def stream_load(url: str, model: str, stop: threading.Event) -> None:
    """Streamed chat completions through the gateway until `stop`."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "tell me a story " * 20}],
        "max_tokens": 12,
        "stream": True,
    }
    with httpx.Client(timeout=30) as client:
        while not stop.is_set():
            with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
                response.raise_for_status()
                for _ in response.iter_bytes():
                    pass


def instant(prometheus: Prometheus, expr: str) -> list[float]:
    """The query's values now, NaN left out (a quantile of nothing is NaN: Grafana shows none)."""
    response = httpx.get(f"{prometheus.url}/api/v1/query", params={"query": expr}, timeout=30)
    answer = response.json()
    assert answer["status"] == "success", f"{expr}: {answer}"
    samples = answer["data"]["result"]
    values = [float(sample["value"][1]) for sample in samples]
    return [value for value in values if not math.isnan(value)]


def with_variables(query: Query) -> str:
    expr = query.expr.replace("$namespace", NAMESPACE).replace("$service", SERVICE)
    return as_prometheus_sees_it(expr)


def test_panels_show_data_from_a_real_prometheus(
    prometheus_binary: Path, sim_binary: Path, tmp_path: Path
) -> None:
    specs = [EngineSpec(NAMESPACE, SERVICE, "unified", LATENCY) for _ in range(2)]
    with (
        ChartPrometheus(prometheus_binary, tmp_path / "prometheus") as prometheus,
        engines(sim_binary, *specs) as started,
        contextlib.ExitStack() as exporters,
    ):
        # The engines serve model `m` (tests/autoscaler/prom.py); the service is `chat`.
        urls = [engine.url for engine in started]
        model = {"namespace": NAMESPACE, "service": SERVICE, "unified": urls}
        static = {"models": {started[0].model: model}}
        discovery = StaticDiscovery(parse_static_config(yaml.safe_dump(static)))
        front = exporters.enter_context(gateway(discovery))
        targets = [Target(f"127.0.0.1:{front.port}")]
        control = ControlPlane()
        registries = [dcgm_standin([engine.pod for engine in started]), *control.registries]
        targets += [exporters.enter_context(serving(r)) for r in registries]
        prometheus.set_targets(started, targets)
        prometheus.wait_scraped(started)

        stop = threading.Event()
        workers = [
            threading.Thread(
                target=stream_load, args=(front.url, started[0].model, stop), daemon=True
            )
            for _ in range(4)
        ]
        workers.append(threading.Thread(target=control.run, args=(stop,), daemon=True))
        for worker in workers:
            worker.start()
        try:
            # The pool group runs every 15 s (its own interval), not every second, and a rate
            # needs two samples in its window: each panel is waited for, none sampled once.
            shown: dict[str, set[str]] = {}

            def all_shown() -> bool | None:
                for path in DASHBOARDS:
                    for query in queries(path):
                        if query.where in shown.get(path.name, set()):
                            continue
                        if instant(prometheus, with_variables(query)):
                            shown.setdefault(path.name, set()).add(query.where)
                missing = {n: e - shown.get(n, set()) for n, e in WITH_DATA.items()}
                return True if not any(missing.values()) else None

            with contextlib.suppress(AssertionError):
                wait_for(all_shown, 120, "every panel fed to show data", every=2)
        finally:
            stop.set()
            for worker in workers:
                worker.join(timeout=30)
    for name, expected in WITH_DATA.items():
        missing = expected - shown.get(name, set())
        assert not missing, f"{name}: no data in {missing} within 120 s"
    assert "variable namespace" in shown["fleet.json"]
    assert "variable service" in shown["service.json"]
