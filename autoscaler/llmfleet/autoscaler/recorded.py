"""The full pass from recording rules (issue 28), pure: which records it reads, the PromQL that
reads them, and whether a Prometheus evaluates them with the autoscaler's own windows.

Why. The raw full pass (`promql.signal_queries`) makes Prometheus evaluate every signal over
every engine series of the fleet (~29 per pod) inside the pass: at 1,000 services x 10 pods
about 3.5-4 s on 2 cores (`bench/autoscaler_query_scale.py`). Recording rules evaluate the same
expressions on Prometheus' own schedule (the chart's group `llmfleet.pools`, every 15 s), and
the pass then reads one already aggregated series per pool and signal (per bucket for the
histograms): instant selectors of a few series per pool, not range functions over every pod's.
That moves Prometheus' cost off the pass's critical path; it does not remove it (the rule
group costs about what one raw pass did, once per evaluation interval, whether or not an
autoscaler reads it).

The records. `recording_rules(options)`: record name -> expression, each one of
`promql.signal_queries` over every pool (`matchers()`), so a record holds exactly what the raw
query would compute for the pool at the rule's evaluation instant. The peak is the exception:
its record is the short rate (`promql.short_rate`), and the read takes its `max_over_time`
over `rate_window` (the recorded samples, one per evaluation, stand in for the raw query's
subquery steps: the same at an evaluation interval equal to `peak_step`). Names follow
level:metric:operation with the window in the operation (`llmfleet_pool:requests:rate1m`);
the chart's `charts/llmfleet/files/rules/recording.yaml` is this at the default options
(tests/chart/test_rules.py checks it).

What differs from the raw read (the autoscaler's docs, docs/architecture.md, say it too):
- every figure is as of the group's last evaluation: up to one evaluation interval older than
  the raw read's. `observed_at` keeps its meaning, the newest *sample's* time (the record is
  `max(timestamp(...))`, evaluated then), so a Prometheus that stopped scraping, or stopped
  evaluating, shows up as stale and the policy holds;
- a new pool is absent (held) until the group's next evaluation after its first scrape;
- the fast pass reads the raw gauges either way (`promql.gauge_queries`): a queue is seen
  within a scrape, not a scrape plus an evaluation.

Detection. `check_rules` compares Prometheus' `/api/v1/rules` answer with `recording_rules` of
the autoscaler's own options: every record must exist once, healthy (evaluated without error),
with exactly that expression (whitespace aside: Prometheus answers with its own formatting).
Custom windows, an older chart, rules not loaded at all, or evaluated less often than every
30 s: the raw query, never a record of other windows or one too old.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llmfleet.autoscaler.promql import (
    HISTOGRAMS,
    QueryOptions,
    matchers,
    short_rate,
    signal_queries,
)

LEVEL = "llmfleet_pool"
"""The records' level: per engine pool (namespace, llmfleet_dev_service, llmfleet_dev_pool)."""
PEAK = "peak_prompt_tokens_rate"


def record_names(options: QueryOptions) -> dict[str, str]:
    """Signal -> the record it is read from (pure); the peak's is its short rate's."""
    w, mw, pw = options.rate_window, options.mean_window, options.peak_window
    return {
        "observed_at": f"{LEVEL}:requests_running_timestamp_seconds:max",
        "request_rate": f"{LEVEL}:requests:rate{w}",
        "prompt_tokens_rate": f"{LEVEL}:prompt_tokens:rate{w}",
        PEAK: f"{LEVEL}:prompt_tokens:rate{pw}",
        "mean_prompt_tokens": f"{LEVEL}:request_prompt_tokens:mean{mw}",
        "mean_output_tokens": f"{LEVEL}:request_generation_tokens:mean{mw}",
        "running": f"{LEVEL}:requests_running:sum",
        "waiting": f"{LEVEL}:requests_waiting:sum",
        "kv_cache_usage": f"{LEVEL}:kv_cache_usage:busy_mean",
        "preemption_rate": f"{LEVEL}:preemptions:rate{w}",
        **{
            signal: f"{LEVEL}:{histogram.removeprefix('vllm:')}_bucket:increase{w}"
            for signal, histogram in HISTOGRAMS.items()
        },
        "gpu_utilization": f"{LEVEL}:gpu_utilization:mean",
    }


def recording_rules(options: QueryOptions) -> dict[str, str]:
    """Record name -> expression of every record the recorded full pass reads (pure)."""
    every = {**signal_queries(options, matchers()), PEAK: short_rate(options, matchers())}
    return {name: every[signal] for signal, name in record_names(options).items()}


def recorded_queries(options: QueryOptions, match: str) -> dict[str, str]:
    """Per signal, the PromQL that reads its record for the pools `match` selects (pure): the
    same signals, labels and values as `signal_queries(options, match)`, as of the records'
    last evaluation."""
    names = record_names(options)
    queries = {signal: f"{name}{{{match}}}" for signal, name in names.items()}
    queries[PEAK] = f"max_over_time({names[PEAK]}{{{match}}}[{options.rate_window}])"
    return queries


@dataclass(frozen=True)
class RulesCheck:
    """What `/api/v1/rules` says about the records of one `QueryOptions`."""

    problem: str
    """Why the recorded path cannot serve them; "" when it can."""
    interval_s: float = 0.0
    """The slowest evaluation interval of the groups that hold them (how old a read may be)."""


def _canonical(expr: str) -> str:
    return "".join(expr.split())


def check_rules(
    groups: Sequence[Mapping[str, Any]], options: QueryOptions, max_interval_s: float = 30.0
) -> RulesCheck:
    """Whether Prometheus records every series the recorded pass reads, with `options`' windows,
    at least every `max_interval_s` (pure), from `/api/v1/rules`' `data.groups`.

    NOTE: the interval bounds how old a read is: a record's newest-sample time is up to one
    evaluation plus one scrape old when read, and the policy holds a pool whose newest sample is
    over 60 s old (`PolicyConfig.stale_after_s`), so a group evaluated every minute (Prometheus'
    default) would hold pools at random: the raw series instead."""
    found: dict[str, list[tuple[Mapping[str, Any], float]]] = {}
    for group in groups:
        for rule in group.get("rules", []):
            if rule.get("type") == "recording":
                found.setdefault(rule["name"], []).append((rule, float(group["interval"])))
    wanted = recording_rules(options)
    for name, expr in wanted.items():
        rules = found.get(name, [])
        if not rules:
            return RulesCheck(f"no recording rule {name}")
        if len(rules) > 1:
            return RulesCheck(f"{len(rules)} recording rules write {name}")
        query = rules[0][0].get("query", "")
        if _canonical(query) != _canonical(expr):
            return RulesCheck(
                f"{name} records {query!r}, not the autoscaler's {expr!r} "
                "(other windows or an older chart)"
            )
    # Only then their health: a rule not evaluated yet is a matter of seconds.
    for name in wanted:
        rule, _ = found[name][0]
        if rule.get("health") != "ok":
            error = rule.get("lastError") or "not evaluated yet"
            return RulesCheck(f"{name} is {rule.get('health')}: {error}")
    interval = max(found[name][0][1] for name in wanted)
    if interval > max_interval_s:
        return RulesCheck(
            f"the records are evaluated every {interval:g} s, more than {max_interval_s:g} s",
            interval,
        )
    return RulesCheck("", interval)
