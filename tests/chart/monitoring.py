"""What the observability tests share: the chart's rule files and dashboards, promtool, the
metric names each exporter has (llmfleet's own registries, vLLM's and DCGM's written-down lists,
the pending list), and the metric names a PromQL expression reads."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry

from llmfleet.autoscaler.metrics import AutoscalerMetrics
from llmfleet.core.cluster import build
from llmfleet.gateway.metrics import GatewayMetrics
from llmfleet.operator.metrics import OperatorMetrics

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "llmfleet"
FILES = CHART / "files"
RULE_FILES = sorted((FILES / "rules").glob("*.yaml"))
DASHBOARDS = sorted((FILES / "dashboards").glob("*.json"))
HERE = Path(__file__).resolve().parent
RULE_TESTS = sorted((HERE / "rules").glob("*.test.yaml"))
METRIC_LISTS = HERE / "metrics"


def promtool() -> Path:
    """promtool from the cached Debian Prometheus package (fetched if missing)."""
    return build.ensure_binary("prometheus", "promtool")


# --- metric names each source exports ---------------------------------------------------------

_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("", "_sum", "_count"),
    "gauge": ("",),
    "info": ("_info",),
}


def series_names(family: str, kind: str) -> set[str]:
    """The names a prometheus_client family of this type is exposed under (`_created` left out:
    no rule reads it)."""
    return {family + suffix for suffix in _SUFFIXES[kind]}


def registry_names(registry: CollectorRegistry) -> set[str]:
    names: set[str] = set()
    for family in registry.collect():
        names |= series_names(family.name, family.type)
    return names


def llmfleet_names() -> dict[str, set[str]]:
    """The gateway's, operator's and autoscaler's own series names, from their registries."""
    return {
        "gateway": registry_names(GatewayMetrics().registry),
        "operator": registry_names(OperatorMetrics().registry),
        "autoscaler": registry_names(AutoscalerMetrics().registry),
    }


def _rows(path: Path) -> Iterator[list[str]]:
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            yield line.split()


def vllm_names() -> set[str]:
    """Series names of vLLM's families as tests/chart/metrics/vllm.txt lists them."""
    names: set[str] = set()
    for family, kind in _rows(METRIC_LISTS / "vllm.txt"):
        names |= series_names(family, kind)
    return names


def dcgm_names() -> dict[str, str]:
    """dcgm-exporter's metrics: name -> `default` (exported by its default counters file) or
    `disabled` (listed there, commented out)."""
    return {name: status for name, _kind, status in _rows(METRIC_LISTS / "dcgm.txt")}


def pending_names() -> set[str]:
    """Series names no component exports yet (tests/chart/metrics/pending.txt)."""
    names: set[str] = set()
    for family, kind, _labels in _rows(METRIC_LISTS / "pending.txt"):
        names |= series_names(family, kind)
    return names


def dcgm_counters_file(path: Path) -> set[str]:
    """The fields a dcgm-exporter counters CSV enables (its own format: `FIELD, type, help`,
    `#` comments; `label` lines are labels, not metrics)."""
    fields = set()
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("#") or "," not in line:
            continue
        field, kind = (part.strip() for part in line.split(",")[:2])
        if kind != "label":
            fields.add(field)
    return fields


# --- metric names a PromQL expression reads ---------------------------------------------------

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_BRACES = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![\w:.$])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])(\s*\()?")
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
             "or", "unless", "offset", "inf", "nan", "Inf", "NaN"}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects: identifiers that are not functions, keywords,
    label names, durations or strings (Grafana's `$variables` are never names)."""
    text = _STRING.sub('""', expr)
    text = _BRACES.sub(" ", text)
    text = _BRACKETS.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    return {
        match[1] for match in _IDENT.finditer(text) if not match[2] and match[1] not in _KEYWORDS
    }


# --- the chart's rules and dashboards ---------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    file: str
    group: str
    name: str
    """The alert's or the recording's name."""
    expr: str
    alert: bool


def rules() -> list[Rule]:
    found = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                alert = "alert" in rule
                name = rule["alert"] if alert else rule["record"]
                found.append(Rule(path.name, group["name"], name, rule["expr"], alert))
    return found


@dataclass(frozen=True)
class Query:
    dashboard: str
    where: str
    """The panel's title (or `variable NAME`)."""
    expr: str
    """As Grafana sends it, `$variables` included."""


_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$", re.S)


def load_dashboard(path: Path) -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(path.read_text())
    return dashboard


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows too."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def queries(path: Path) -> list[Query]:
    """Each PromQL query of a dashboard: its panels' targets and its query variables (the
    metric inside Grafana's `label_values(metric, label)`)."""
    dashboard = load_dashboard(path)
    found = [
        Query(path.name, panel["title"], target["expr"])
        for panel in panels(dashboard)
        for target in panel.get("targets", [])
    ]
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") != "query":
            continue
        query = variable["query"]
        text = query["query"] if isinstance(query, dict) else query
        match = _LABEL_VALUES.match(text)
        found.append(Query(path.name, f"variable {variable['name']}", match[1] if match else text))
    return found


GRAFANA_VARIABLES = {
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$__range": "1h",
}


def as_prometheus_sees_it(expr: str) -> str:
    """The query with Grafana's variables replaced as Grafana would before sending it."""
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return re.sub(r"\$\{?([a-zA-Z_][a-zA-Z0-9_]*)\}?", r"\1", expr)
