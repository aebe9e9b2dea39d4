"""Every metric name the chart's rules and dashboards read is one that something exports: the
gateway, the operator or the autoscaler (their own registries, read here), vLLM or DCGM (the
lists in tests/chart/metrics/, each with its source and version), a recording rule of the chart,
or a name still pending in the operator (tests/chart/metrics/pending.txt)."""

from __future__ import annotations

import pytest

from tests.chart.monitoring import (
    DASHBOARDS,
    FILES,
    dcgm_counters_file,
    dcgm_names,
    llmfleet_names,
    metric_names,
    pending_names,
    queries,
    rules,
    vllm_names,
)


def _read() -> dict[str, set[str]]:
    """Metric name -> where it is read (a rule or a dashboard panel)."""
    found: dict[str, set[str]] = {}
    for rule in rules():
        for name in metric_names(rule.expr):
            found.setdefault(name, set()).add(f"{rule.file}: {rule.name}")
    for path in DASHBOARDS:
        for query in queries(path):
            for name in metric_names(query.expr):
                found.setdefault(name, set()).add(f"{path.name}: {query.where}")
    return found


def _recorded() -> set[str]:
    return {rule.name for rule in rules() if not rule.alert}


def _exported() -> dict[str, set[str]]:
    return {**llmfleet_names(), "vllm": vllm_names(), "dcgm": set(dcgm_names())}


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("up", {"up"}),
        ('sum by (namespace, le) (rate(x_bucket{job="a", le!=""}[5m]))', {"x_bucket"}),
        ("histogram_quantile(0.95, a) > on (ns) group_left (pool) b", {"a", "b"}),
        ("deriv(l:w:sum[10m]) > 0 and min_over_time(c[1m:15s]) > 1e3", {"l:w:sum", "c"}),
        ('label_replace(vllm:x, "dst", "$1", "src", "(.*)") offset 5m', {"vllm:x"}),
        ("sum(rate(y_total[$__rate_interval])) or vector(0)", {"y_total"}),
        ('a{namespace=~"$namespace"} / ignoring (le) b unless bool c', {"a", "b", "c"}),
    ],
    ids=["bare", "labels-and-grouping", "matching", "ranges-numbers", "strings-offset", "grafana",
         "set-ops"],
)  # fmt: skip
def test_metric_names_are_read_from_promql(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_the_rules_and_dashboards_read_a_metric_of_every_source() -> None:
    """The check below is not vacuous: names of every exporter are read."""
    read = set(_read())
    for source, names in _exported().items():
        assert read & names, f"nothing of {source} is read"
    assert read & _recorded()
    assert read >= pending_names()  # what is pending is still read (empty once all exported)


def test_every_metric_read_is_exported_recorded_or_pending() -> None:
    known = set().union(*_exported().values(), _recorded(), pending_names())
    unknown = {name: sorted(where) for name, where in _read().items() if name not in known}
    assert not unknown, f"read but exported by nothing: {unknown}"


def test_a_misspelt_metric_would_be_caught() -> None:
    known = set().union(*_exported().values(), _recorded(), pending_names())
    misspelt = metric_names("rate(llmfleet_gateway_request_total[5m])")  # not ..._requests_total
    assert misspelt
    assert not misspelt <= known


def test_pending_names_are_still_pending_and_still_read() -> None:
    """A pending metric leaves the list once a component exports it; one nothing reads goes."""
    pending = pending_names()
    exported = set().union(*_exported().values())
    assert not pending & exported, f"exported now, remove from pending.txt: {pending & exported}"
    read = set(_read())
    families = {name for name in pending if name in read}
    assert families == pending, f"pending but read by nothing: {pending - families}"


def test_dcgm_counters_the_alerts_need_are_enabled_by_the_shipped_counters_file() -> None:
    """dcgm-exporter's defaults leave the ECC and NVLink error counters out; the chart's
    counters file turns on every DCGM field the rules and dashboards read, and only known ones."""
    known = dcgm_names()
    shipped = dcgm_counters_file(FILES / "dcgm" / "counters.csv")
    assert shipped <= set(known), f"not dcgm-exporter fields: {shipped - set(known)}"
    default = {name for name, status in known.items() if status == "default"}
    assert default <= shipped, f"the counters file drops defaults: {default - shipped}"
    read = {name for name in _read() if name in known}
    assert read <= shipped, f"read but not in files/dcgm/counters.csv: {read - shipped}"
    needing = {name for name in read if known[name] == "disabled"}
    assert needing == {
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    }
