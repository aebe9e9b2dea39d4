"""The recorded full pass's pure parts (its records, the PromQL that reads them, the check of
`/api/v1/rules`) and how `PrometheusSignals` picks its source per pass."""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlsplit

import pytest

from llmfleet.autoscaler.recorded import (
    RulesCheck,
    check_rules,
    record_names,
    recorded_queries,
    recording_rules,
)
from llmfleet.autoscaler.signals import PrometheusSignals, QueryOptions, signal_queries
from tests.net import posted_query, served

DEFAULTS = QueryOptions()
M = 'llmfleet_dev_service!=""'


def test_every_signal_of_the_raw_pass_has_a_recorded_read() -> None:
    assert list(recorded_queries(DEFAULTS, M)) == list(signal_queries(DEFAULTS, M))


@pytest.mark.parametrize(
    ("signal", "expected"),
    [
        pytest.param(
            "observed_at", f"llmfleet_pool:requests_running_timestamp_seconds:max{{{M}}}", id="at"
        ),
        pytest.param("request_rate", f"llmfleet_pool:requests:rate1m{{{M}}}", id="rate"),
        pytest.param(
            "peak_prompt_tokens_rate",
            f"max_over_time(llmfleet_pool:prompt_tokens:rate30s{{{M}}}[1m])",
            id="peak-of-the-short-rate",
        ),
        pytest.param(
            "mean_prompt_tokens", f"llmfleet_pool:request_prompt_tokens:mean5m{{{M}}}", id="mean"
        ),
        pytest.param(
            "ttft_buckets",
            f"llmfleet_pool:time_to_first_token_seconds_bucket:increase1m{{{M}}}",
            id="buckets",
        ),
    ],
)
def test_recorded_queries(signal: str, expected: str) -> None:
    assert recorded_queries(DEFAULTS, M)[signal] == expected


def test_the_record_names_carry_the_windows() -> None:
    names = record_names(QueryOptions(rate_window="2m", mean_window="10m", peak_window="1m"))
    assert names["request_rate"] == "llmfleet_pool:requests:rate2m"
    assert names["mean_output_tokens"] == "llmfleet_pool:request_generation_tokens:mean10m"
    assert names["peak_prompt_tokens_rate"] == "llmfleet_pool:prompt_tokens:rate1m"


def test_a_peak_window_equal_to_the_rate_window_shares_its_record() -> None:
    rules = recording_rules(QueryOptions(rate_window="1m", peak_window="1m"))
    assert len(rules) == len(recording_rules(DEFAULTS)) - 1


def groups(
    rules: dict[str, str], interval: float = 15, health: str = "ok", **extra: Any
) -> list[dict[str, Any]]:
    """`/api/v1/rules`' groups recording `rules`, as Prometheus answers."""
    rows = [
        {"name": name, "query": expr, "health": health, "type": "recording", **extra}
        for name, expr in rules.items()
    ]
    return [{"name": "llmfleet.pools", "interval": interval, "rules": rows}]


RATE = "llmfleet_pool:requests:rate1m"
OTHER = recording_rules(QueryOptions(rate_window="2m"))


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        pytest.param(groups(recording_rules(DEFAULTS)), "", id="all-there"),
        pytest.param(
            # Prometheus answers with its own spacing (`group_left(`, no folded lines).
            groups({n: e.replace(" (", "(") for n, e in recording_rules(DEFAULTS).items()}),
            "",
            id="formatting-aside",
        ),
        pytest.param([], "no recording rule", id="no-rules"),
        pytest.param(
            groups({n: e for n, e in recording_rules(DEFAULTS).items() if n != RATE}),
            f"no recording rule {RATE}",
            id="one-missing",
        ),
        pytest.param(
            groups({**recording_rules(DEFAULTS), RATE: OTHER["llmfleet_pool:requests:rate2m"]}),
            f"{RATE} records",
            id="same-name-other-window",
        ),
        pytest.param(groups(OTHER), "no recording rule", id="other-windows"),
        pytest.param(
            groups(recording_rules(DEFAULTS)) + groups({RATE: recording_rules(DEFAULTS)[RATE]}),
            f"2 recording rules write {RATE}",
            id="written-twice",
        ),
        pytest.param(
            groups(recording_rules(DEFAULTS), health="unknown"),
            "is unknown: not evaluated yet",
            id="not-evaluated-yet",
        ),
        pytest.param(
            groups(recording_rules(DEFAULTS), interval=60),
            "evaluated every 60 s, more than 30 s",
            id="evaluated-too-seldom",
        ),
        pytest.param(
            groups(recording_rules(DEFAULTS), health="err", lastError="query timed out"),
            "is err: query timed out",
            id="failing",
        ),
    ],
)
def test_check_rules(answer: list[dict[str, Any]], problem: str) -> None:
    found = check_rules(answer, DEFAULTS)
    if problem:
        assert problem in found.problem
    else:
        assert found == RulesCheck("", 15.0)


def test_the_slowest_group_bounds_the_age() -> None:
    rules = list(recording_rules(DEFAULTS).items())
    answer = groups(dict(rules[:3]), interval=15) + groups(dict(rules[3:]), interval=30)
    assert check_rules(answer, DEFAULTS) == RulesCheck("", 30.0)


class _Rules(BaseHTTPRequestHandler):
    """A Prometheus whose `/api/v1/rules` answers `groups` (503 when None) and whose queries
    answer nothing; it keeps what it was asked."""

    groups: ClassVar[list[dict[str, Any]] | None] = None
    asked: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        assert url.path == "/api/v1/rules", url.path
        type(self).asked.append(f"rules {parse_qs(url.query).get('type')}")
        self._answer({"groups": self.groups})

    def do_POST(self) -> None:
        type(self).asked.append(posted_query(self))
        self._answer({"resultType": "vector", "result": []})

    def _answer(self, data: Any) -> None:
        if data == {"groups": None}:
            self.send_response(503)
            self.end_headers()
            return
        body = json.dumps({"status": "success", "data": data}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def stub() -> Iterator[str]:
    _Rules.groups, _Rules.asked = None, []
    with served(_Rules) as url:
        yield url


WANTED = {("ns", "chat"): ["unified"]}


def _pass(signals: PrometheusSignals) -> list[str]:
    """One full pass: what it asked Prometheus, queries as "raw" or "recorded"."""
    _Rules.asked = []
    signals.read_services(WANTED)
    return [
        ask if ask.startswith("rules") else "recorded" if "llmfleet_pool:" in ask else "raw"
        for ask in _Rules.asked
    ]


def test_the_source_is_chosen_per_pass_and_the_rules_asked_every_check(stub: str) -> None:
    now = [0.0]
    signals = PrometheusSignals(stub, rules_check_s=60, clock=lambda: now[0])
    try:
        # No answer from /api/v1/rules: raw, and asked again at the next pass.
        assert _pass(signals) == ["rules ['record']", "raw"]
        assert "rules unreadable" in signals.rules.problem
        # Rules of other windows: raw until the next check.
        _Rules.groups = groups(recording_rules(QueryOptions(rate_window="2m")))
        assert _pass(signals) == ["rules ['record']", "raw"]
        _Rules.groups = groups(recording_rules(DEFAULTS))
        now[0] = 59
        assert _pass(signals) == ["raw"]
        now[0] = 60
        assert _pass(signals) == ["rules ['record']", "recorded"]
        now[0] = 119
        assert _pass(signals) == ["recorded"]
        # The chart's rules gone (an older chart rolled back): raw from the next check on.
        _Rules.groups = []
        now[0] = 120
        assert _pass(signals) == ["rules ['record']", "raw"]
        assert signals.source() == "raw"
    finally:
        signals.close()


def test_off_never_asks_for_the_rules(stub: str) -> None:
    _Rules.groups = groups(recording_rules(DEFAULTS))
    signals = PrometheusSignals(stub, recorded_rules="off")
    try:
        assert _pass(signals) == ["raw"]
    finally:
        signals.close()


def test_a_reader_of_other_windows_never_reads_the_defaults_records(stub: str) -> None:
    _Rules.groups = groups(recording_rules(DEFAULTS))
    signals = PrometheusSignals(stub, rate_window="5s")
    try:
        assert _pass(signals) == ["rules ['record']", "raw"]
        assert "no recording rule llmfleet_pool:requests:rate5s" in signals.rules.problem
    finally:
        signals.close()


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="auto or off"):
        PrometheusSignals("http://127.0.0.1:9", recorded_rules="on")
