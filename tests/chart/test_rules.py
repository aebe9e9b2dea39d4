"""The chart's Prometheus rules (charts/llmfleet/files/rules/): promtool checks them, runs their
unit tests (tests/chart/rules/*.test.yaml: every alert fires on synthetic faulty series and stays
quiet on healthy ones), and the pool recording rules are the autoscaler's own queries."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmfleet.autoscaler.recorded import RulesCheck, check_rules, recording_rules
from llmfleet.autoscaler.settings import AutoscalerSettings
from llmfleet.autoscaler.signals import HISTOGRAMS, QueryOptions, matchers, signal_queries
from tests.chart.monitoring import REPO, RULE_FILES, RULE_TESTS, promtool, rules


def _promtool(*args: str | Path, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    command = [str(promtool()), *map(str, args)]
    return subprocess.run(
        command, check=False, cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_the_chart_has_rule_files_and_their_tests() -> None:
    assert [path.name for path in RULE_FILES] == ["gpu.yaml", "llm.yaml", "recording.yaml"]
    assert [path.name for path in RULE_TESTS] == [
        "gpu.test.yaml",
        "llm.test.yaml",
        "pools.test.yaml",
        "slo.test.yaml",
    ]


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda path: path.name)
def test_promtool_check_rules(path: Path) -> None:
    result = _promtool("check", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize("path", RULE_TESTS, ids=lambda path: path.name)
def test_promtool_test_rules(path: Path) -> None:
    result = _promtool("test", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def _alert_cases() -> dict[str, tuple[int, int]]:
    """Per alert: how many of the unit tests expect it firing, and how many quiet."""
    cases: dict[str, tuple[int, int]] = {}
    for path in RULE_TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                firing, quiet = cases.get(case["alertname"], (0, 0))
                if case.get("exp_alerts"):
                    firing += 1
                else:
                    quiet += 1
                cases[case["alertname"]] = (firing, quiet)
    return cases


def test_every_alert_is_tested_firing_and_quiet() -> None:
    cases = _alert_cases()
    alerts = {rule.name for rule in rules() if rule.alert}
    untested = {
        alert: cases.get(alert, (0, 0))
        for alert in alerts
        if cases.get(alert, (0, 0))[0] == 0 or cases.get(alert, (0, 0))[1] == 0
    }
    assert not untested, f"alerts without a firing and a quiet case (firing, quiet): {untested}"
    assert not set(cases) - alerts, "tests name alerts the rules do not have"


def test_every_alert_has_a_severity_and_says_what_happened() -> None:
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" not in rule:
                    continue
                assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule
                assert rule["alert"].startswith("LLMFleet"), rule["alert"]
                assert set(rule["annotations"]) == {"summary", "description"}, rule["alert"]


def _normalized(expr: str) -> str:
    return " ".join(expr.split())


# Recording rule -> the autoscaler's signals it mirrors. A quantile: the autoscaler computes
# PromQL's `histogram_quantile` itself (`LatencyHistogram.quantile`) from its bucket signals'
# `increase()`, which is the quantile of their `rate()` (the scale cancels); the first signal a
# pool has wins, as `or` picks.
MIRRORED = {
    "llmfleet_pool:requests:rate1m": ("request_rate",),
    "llmfleet_pool:prompt_tokens:rate1m": ("prompt_tokens_rate",),
    "llmfleet_pool:requests_running:sum": ("running",),
    "llmfleet_pool:requests_waiting:sum": ("waiting",),
    "llmfleet_pool:kv_cache_usage:busy_mean": ("kv_cache_usage",),
    "llmfleet_pool:ttft_seconds:p95_rate1m": ("ttft_buckets",),
    "llmfleet_pool:itl_seconds:p95_rate1m": ("itl_gap_buckets", "tpot_buckets"),
    "llmfleet_pool:preemptions:rate1m": ("preemption_rate",),
    "llmfleet_pool:gpu_utilization:mean": ("gpu_utilization",),
}


def _promql(signal: str) -> str:
    query = signal_queries(QueryOptions(), matchers())[signal]
    if signal not in HISTOGRAMS:
        return query
    return f"histogram_quantile(0.95, {query.replace('(increase(', '(rate(')})"


@pytest.mark.parametrize("record", sorted(MIRRORED))
def test_pool_recording_rules_are_the_autoscalers_queries(record: str) -> None:
    """A dashboard's pool latency or KV usage is the figure the autoscaler sized from: the
    recording rule is signals.py's expression at its defaults (1m window, p95)."""
    expected = " or ".join(_promql(signal) for signal in MIRRORED[record])
    recorded = {rule.name: rule.expr for rule in rules() if not rule.alert}[record]
    assert _normalized(recorded) == _normalized(expected)


def _pools_group() -> dict[str, Any]:
    groups = yaml.safe_load((RULE_FILES[0].parent / "recording.yaml").read_text())["groups"]
    found: dict[str, Any] = next(g for g in groups if g["name"] == "llmfleet.pools")
    return found


@pytest.mark.parametrize("record", sorted(recording_rules(QueryOptions())))
def test_the_chart_records_what_the_autoscalers_full_pass_reads(record: str) -> None:
    """Every record of the recorded full pass (`recorded.recording_rules` at the defaults) is
    in the chart, with the expression the autoscaler would evaluate itself."""
    recorded = {rule["record"]: rule["expr"] for rule in _pools_group()["rules"]}
    assert record in recorded
    assert _normalized(recorded[record]) == _normalized(recording_rules(QueryOptions())[record])


def test_the_autoscalers_default_settings_read_the_charts_records() -> None:
    """The autoscaler, as the chart deploys it by default, finds the chart's records usable
    (its `/api/v1/rules` check, on the chart's rules as Prometheus would list them)."""
    settings = AutoscalerSettings()
    options = QueryOptions(
        rate_window=settings.rate_window,
        peak_window=settings.peak_window,
        peak_step=settings.scrape_interval,
        quantile=settings.latency_quantile,
    )
    group = _pools_group()
    listed = [
        {
            "name": group["name"],
            "interval": 15,
            "rules": [
                {"name": rule["record"], "query": rule["expr"], "health": "ok",
                 "type": "recording"}
                for rule in group["rules"]
            ],
        }
    ]  # fmt: skip
    assert group["interval"] == "15s"
    assert check_rules(listed, options) == RulesCheck("", 15.0)


@pytest.mark.parametrize(
    ("file", "before", "after", "alert"),
    [
        ("gpu.yaml", "DCGM_FI_DEV_GPU_TEMP > 95", "DCGM_FI_DEV_GPU_TEMP > 99", "Temperature"),
        ("llm.yaml", "busy_mean > 0.9", "busy_mean > 0.97", "LLMFleetKVCacheFull"),
        ("recording.yaml", "histogram_quantile(0.28", "histogram_quantile(0.05", "TTFTBudget"),
    ],
    ids=["gpu", "llm", "recording"],
)
def test_the_unit_tests_catch_a_changed_threshold(
    tmp_path: Path, file: str, before: str, after: str, alert: str
) -> None:
    """The unit tests have teeth: the same tests on a copy of the rules with one threshold
    moved fail and name the alert."""
    rules_dir = tmp_path / "charts" / "llmfleet" / "files" / "rules"
    tests_dir = tmp_path / "tests" / "chart" / "rules"
    shutil.copytree(RULE_FILES[0].parent, rules_dir)
    shutil.copytree(RULE_TESTS[0].parent, tests_dir)
    changed = rules_dir / file
    text = changed.read_text()
    assert before in text
    changed.write_text(text.replace(before, after))
    results = [_promtool("test", "rules", path, cwd=tmp_path) for path in tests_dir.iterdir()]
    failed = [result for result in results if result.returncode != 0]
    assert failed
    assert any(alert in result.stdout + result.stderr for result in failed)
