"""The recorded full pass against a real Prometheus: the same PoolSignals as the raw pass for the
same series, and the raw pass whenever the records are absent or of other windows.

The series come from a stand-in exporter whose every sample carries its own timestamp and whose
counters (and histogram buckets) grow exactly linearly with it: every rate and increase is then
the same whenever Prometheus evaluates it (inside the pass, or in a rule a second earlier), so
the two paths can be compared figure for figure, and `observed_at` can be checked to be a time
the exporter stamped a sample with, never an evaluation's."""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import fields
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
import yaml

from llmfleet.autoscaler.goodput import LatencyHistogram
from llmfleet.autoscaler.inputs import PoolSignals
from llmfleet.autoscaler.recorded import recording_rules
from llmfleet.autoscaler.signals import PrometheusSignals, QueryOptions
from tests.autoscaler.prom import Prometheus, Target
from tests.chart.monitoring import RULE_FILES
from tests.net import wait_for

# 1 s scrapes and evaluations: windows of a few of them.
OPTIONS = QueryOptions(rate_window="5s", mean_window="10s", peak_window="2s", peak_step="1s")
POOLS = [("ns", "chat", "prefill"), ("ns", "chat", "decode"), ("ns", "code", "unified")]
WANTED = {("ns", "chat"): ["prefill", "decode"], ("ns", "code"): ["unified"]}
# Per pod, per second: (counter, slope); histograms as cumulative buckets' slopes.
COUNTERS = {
    "vllm:request_success_total": 2.0,
    "vllm:prompt_tokens_total": 300.0,
    "vllm:num_preemptions_total": 0.25,
    "vllm:request_prompt_tokens_sum": 300.0,
    "vllm:request_prompt_tokens_count": 2.0,
    "vllm:request_generation_tokens_sum": 40.0,
    "vllm:request_generation_tokens_count": 2.0,
}
BUCKETS = {
    "vllm:time_to_first_token_seconds": {"0.1": 1.0, "0.5": 1.5, "+Inf": 2.0},
    "vllm:inter_token_latency_seconds": {"0.01": 10.0, "0.025": 30.0, "+Inf": 38.0},
    "vllm:request_prefill_time_seconds": {"0.05": 1.5, "0.5": 2.0, "+Inf": 2.0},
}


class _Exporter(BaseHTTPRequestHandler):
    """Two pods per pool; each sample stamped with the scrape's millisecond (kept in
    `stamped`), each counter `slope * t`."""

    stamped: ClassVar[set[int]] = set()

    def do_GET(self) -> None:
        ms = int(time.time() * 1000)
        type(self).stamped.add(ms)
        t = ms / 1000
        lines = []
        for namespace, service, pool in POOLS:
            for pod in (f"{service}-{pool}-0", f"{service}-{pool}-1"):
                labels = (
                    f'namespace="{namespace}",llmfleet_dev_service="{service}",'
                    f'llmfleet_dev_pool="{pool}",pod="{pod}",instance="{pod}"'
                )
                busy = pod.endswith("-0")  # the other pod is a spare: no cache, no requests
                gauges = {
                    "vllm:num_requests_running": 3.0 if busy else 0.0,
                    "vllm:num_requests_waiting": 1.0 if busy else 0.0,
                    "vllm:kv_cache_usage_perc": 0.4 if busy else 0.0,
                }
                for name, value in gauges.items():
                    lines.append(f"{name}{{{labels}}} {value} {ms}")
                for name, slope in COUNTERS.items():
                    lines.append(f"{name}{{{labels}}} {slope * t!r} {ms}")
                for name, buckets in BUCKETS.items():
                    for le, slope in buckets.items():
                        lines.append(f'{name}_bucket{{{labels},le="{le}"}} {slope * t!r} {ms}')
        body = ("\n".join(lines) + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def exporter() -> Iterator[Target]:
    _Exporter.stamped = set()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Exporter)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Target(f"127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _rule_file(directory: Path, options: QueryOptions) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    rules = [{"record": name, "expr": expr} for name, expr in recording_rules(options).items()]
    path = directory / "pools.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "llmfleet.pools", "rules": rules}]}))
    return path


def _flat(signals: PoolSignals) -> dict[str, float | None]:
    """Every figure of `signals` but `observed_at`, histograms as one figure per bucket."""
    found: dict[str, float | None] = {}
    for field in fields(signals):
        value = getattr(signals, field.name)
        if field.name == "observed_at":
            continue
        if isinstance(value, LatencyHistogram):
            for bound, count in zip(value.bounds, value.counts, strict=True):
                found[f"{field.name} le={bound}"] = count
        else:
            found[field.name] = value
    return found


def _reader(url: str, options: QueryOptions, recorded_rules: str = "auto") -> PrometheusSignals:
    """A reader of `options`' windows that asks for the rules at every pass."""
    return PrometheusSignals(
        url,
        rate_window=options.rate_window,
        mean_window=options.mean_window,
        peak_window=options.peak_window,
        peak_step=options.peak_step,
        recorded_rules=recorded_rules,
        rules_check_s=0,
    )


def _pools(signals: PrometheusSignals) -> dict[str, PoolSignals]:
    """One full pass's pools, as "service/pool"."""
    read = signals.read_services(WANTED)
    return {
        f"{service}/{pool}": found
        for (_, service), pools in read.items()
        if isinstance(pools, dict)
        for pool, found in pools.items()
    }


def _equal(a: PoolSignals, b: PoolSignals) -> bool:
    left, right = _flat(a), _flat(b)
    if left.keys() != right.keys():
        return False
    return all(
        x == y if x is None or y is None else math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-9)
        for x, y in ((left[k], right[k]) for k in left)
    )


def test_the_recorded_pass_reads_what_the_raw_pass_reads(
    prometheus_binary: Path, tmp_path: Path
) -> None:
    rules = _rule_file(tmp_path / "rules", OPTIONS)
    with (
        Prometheus(prometheus_binary, tmp_path / "prometheus", rule_files=[rules]) as prometheus,
        exporter() as target,
    ):
        prometheus.set_targets([], [target])
        recorded = _reader(prometheus.url, OPTIONS)
        raw = _reader(prometheus.url, OPTIONS, recorded_rules="off")
        try:
            wait_for(lambda: recorded.source() == "recorded" or None, 30, "the records")
            assert recorded.rules.interval_s == 1

            def both() -> tuple[dict[str, PoolSignals], dict[str, PoolSignals]] | None:
                """One read of each path, once the raw one has full rate windows (its rate is
                the exporter's slope: every pool's two pods, 2 requests a second each) and the
                two agree; None until then (windows still filling, or on a busy machine a
                scrape late enough that one window's extrapolation differs: the next try)."""
                a, b = _pools(recorded), _pools(raw)
                if len(a) != len(POOLS) or a.keys() != b.keys():
                    return None
                if not all(math.isclose(found.request_rate, 4.0) for found in b.values()):
                    return None
                return (a, b) if all(_equal(a[key], b[key]) for key in a) else None

            found = wait_for(both, 60, "the recorded and raw passes to agree", every=0.5)
        finally:
            recorded.close()
            raw.close()
    from_records, from_raw = found
    decode = from_records["chat/decode"]
    print(f"\nrecorded: {decode}\nraw: {from_raw['chat/decode']}")
    # Two pods per pool, the exporter's slopes: the figures are what the series say.
    assert decode.request_rate == pytest.approx(4.0)
    assert decode.prompt_tokens_rate == pytest.approx(600.0)
    assert decode.peak_prompt_tokens_rate == pytest.approx(600.0)
    assert (decode.mean_prompt_tokens, decode.mean_output_tokens) == pytest.approx((150, 20))
    assert (decode.running, decode.waiting) == (3.0, 1.0)
    assert decode.kv_cache_usage == pytest.approx(0.4)  # the spare does not dilute it
    assert decode.preemption_rate == pytest.approx(0.5)
    assert decode.ttft_histogram is not None
    assert decode.ttft_histogram.total == pytest.approx(2 * 2.0 * 5)
    assert decode.itl_histogram is not None
    assert decode.prefill_histogram is not None
    assert decode.gpu_utilization is None
    # observed_at is a sample's own time (one the exporter stamped), never an evaluation's: as
    # old as the records, at most an evaluation behind the raw read's.
    for name, signals in from_records.items():
        raw_at = from_raw[name].observed_at
        assert int(signals.observed_at.timestamp() * 1000) in _Exporter.stamped
        assert 0 <= (raw_at - signals.observed_at).total_seconds() <= 2


@pytest.mark.parametrize(
    ("rule_files", "options", "problem"),
    [
        pytest.param([], OPTIONS, "no recording rule", id="no-rules"),
        # The chart's records are of the default windows (1m): a reader of 5 s windows must
        # not take them for its own.
        pytest.param(
            RULE_FILES, OPTIONS, "no recording rule llmfleet_pool:requests:rate5s", id="chart"
        ),
        pytest.param(RULE_FILES, QueryOptions(), "", id="chart-default-windows"),
    ],
)
def test_absent_or_other_records_fall_back_to_the_raw_pass(
    prometheus_binary: Path,
    tmp_path: Path,
    rule_files: list[Path],
    options: QueryOptions,
    problem: str,
) -> None:
    """A real Prometheus' `/api/v1/rules` (its own formatting of the expressions): the chart's
    rules are recognised at the defaults, and any other reader falls back to the raw series
    and still reads every pool."""
    with (
        Prometheus(prometheus_binary, tmp_path / "prometheus", rule_files=rule_files) as prom,
        exporter() as target,
    ):
        prom.set_targets([], [target])
        signals = _reader(prom.url, options)
        try:
            if not problem:
                # The chart's group is evaluated every 15 s: healthy after its first run.
                wait_for(lambda: signals.source() == "recorded" or None, 45, "the chart's rules")
                return
            assert signals.source() == "raw"
            assert problem in signals.rules.problem

            def every_pool() -> bool | None:
                read = signals.read_services(WANTED)
                return sum(len(v) for v in read.values() if isinstance(v, dict)) == 3 or None

            wait_for(every_pool, 30, "every pool from the raw series")
        finally:
            signals.close()
