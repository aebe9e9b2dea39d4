"""PoolSignals read from a real Prometheus scraping real simulator engines under known load.

The simulator records its configured latencies exactly (TTFT 100 ms, ITL 25 ms), so the p95s
are what `histogram_quantile` interpolates inside vLLM's buckets: (0.08, 0.1] gives 99 ms and
(0.01, 0.025] gives 24.25 ms.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlencode

import httpx
import pytest

from llmfleet.autoscaler.goodput import Round, capacity_misses, over
from llmfleet.autoscaler.inputs import PoolSignals
from llmfleet.autoscaler.signals import (
    PoolKey,
    PrometheusSignals,
    ServiceKey,
    SignalsUnavailable,
    chunks,
    combined_query,
    signal_queries,
)
from tests.autoscaler.prom import (
    PROMPT,
    Engine,
    EngineSpec,
    Load,
    Prometheus,
    Target,
    UriLimit,
    engines,
)
from tests.net import wait_for

LATENCY = ("--time-to-first-token", "100ms", "--inter-token-latency", "25ms")
DECODE = EngineSpec("ns", "chat", "decode", (*LATENCY, "--max-num-seqs", "2", "--enable-kvcache"))
PREFILL = EngineSpec("ns", "chat", "prefill", LATENCY)
WINDOW_S = 5


def _read(signals: PrometheusSignals, pool: str) -> PoolSignals | None:
    return signals.read("ns", "chat", ["decode", "prefill"]).get(pool)


@dataclass
class Measured:
    load: Load
    sent_rate: float
    """Requests finished per second over the rate window that `during` covers."""
    during: PoolSignals | None = None
    busiest: PoolSignals | None = None
    """The snapshot with the most waiting requests while the load ran."""
    gauges: PoolSignals | None = None
    """The fast pass's read (`read_gauges`) with the most waiting requests while the load ran."""


def _drive(signals: PrometheusSignals, decode: list[Engine]) -> Measured:
    """Run the load for a rate window and more, reading the decode pool twice a second."""
    load = Load(decode)
    busiest: PoolSignals | None = None
    gauges: PoolSignals | None = None
    with load.running():
        started_at = time.monotonic()
        while time.monotonic() - started_at < WINDOW_S + 2:
            snapshot = _read(signals, "decode")
            if snapshot and snapshot.waiting > (busiest.waiting if busiest else -1):
                busiest = snapshot
            fast = signals.read_gauges("ns", "chat", ["decode"]).get("decode")
            if fast and fast.waiting > (gauges.waiting if gauges else -1):
                gauges = fast
            time.sleep(0.5)
        during = _read(signals, "decode")
        now = time.monotonic()
        # Prometheus' newest sample is up to a scrape (1 s) behind.
        sent_rate = load.rate(now - WINDOW_S - 1, now - 1)
    return Measured(load, sent_rate, during, busiest, gauges)


def _assert_fast_gauges(gauges: PoolSignals | None) -> None:
    """The fast pass's read: the same instant values as the full read, nothing windowed."""
    assert gauges is not None
    assert gauges.running >= 2
    assert gauges.waiting >= 1
    assert gauges.kv_cache_usage is not None
    assert 0 < gauges.kv_cache_usage <= 1
    assert (gauges.request_rate, gauges.prompt_tokens_rate, gauges.mean_prompt_tokens) == (0, 0, 0)
    assert gauges.ttft_p95_ms is None
    assert gauges.ttft_histogram is None
    assert gauges.peak_prompt_tokens_rate is None


def test_a_loaded_decode_pool_and_an_idle_prefill_pool(
    prometheus: Prometheus, sim_binary: Path
) -> None:
    # 1 s scrapes: the peak is the highest 2 s rate of the window, searched every second.
    signals = PrometheusSignals(
        prometheus.url, rate_window=f"{WINDOW_S}s", peak_window="2s", peak_step="1s"
    )
    with engines(sim_binary, DECODE, DECODE, PREFILL) as started:
        decode = started[:2]
        prometheus.set_targets(started)
        prometheus.wait_scraped(started)
        # A first request creates the simulator's counters (a fresh one exports only gauges).
        for engine in decode:
            body = {"model": engine.model, "messages": [{"role": "user", "content": PROMPT}]}
            httpx.post(f"{engine.url}/v1/chat/completions", json=body, timeout=30)
        idle = wait_for(lambda: _read(signals, "prefill"), 30, "the idle pool's signals")
        assert (idle.request_rate, idle.running, idle.ttft_p95_ms) == (0.0, 0.0, None)

        measured = _drive(signals, decode)
        ended = datetime.now(UTC)
        after = wait_for(
            lambda: a if (a := _read(signals, "decode")) and a.observed_at > ended else None,
            15, "a scrape after the last request",
        )  # fmt: skip
        age = (datetime.now(UTC) - after.observed_at).total_seconds()
        idle_after = _read(signals, "prefill")

    load, sent_rate, during, busiest = (
        measured.load, measured.sent_rate, measured.during, measured.busiest
    )  # fmt: skip
    assert during is not None
    assert after is not None
    assert busiest is not None
    prompt_tokens = {prompt for _, prompt, _ in load.done}
    assert len(prompt_tokens) == 1
    prompt = prompt_tokens.pop()
    mean_output = sum(out for _, _, out in load.done) / len(load.done)
    print(  # the figures, for the report (pytest -s)
        f"\nsent {len(load.done)} requests, {sent_rate:.1f}/s; during: {during}"
        f"\nbusiest: {busiest}\nafter: {after}"
    )

    assert sent_rate > 3
    assert during.request_rate == pytest.approx(sent_rate, rel=0.35)
    assert during.prompt_tokens_rate == pytest.approx(during.request_rate * prompt, rel=0.2)
    # Steady closed-loop load: the busiest 2 s of the window run at about the window's mean.
    assert during.peak_prompt_tokens_rate is not None
    assert during.prompt_tokens_rate <= during.peak_prompt_tokens_rate
    assert during.peak_prompt_tokens_rate < 3 * during.prompt_tokens_rate
    assert after.mean_prompt_tokens == pytest.approx(prompt)
    assert after.mean_output_tokens == pytest.approx(mean_output, abs=0.6)
    # 6 workers on 2 engines of 2 sequences each: 2 waiting at most moments.
    assert busiest.running >= 2
    assert busiest.waiting >= 1
    assert busiest.kv_cache_usage is not None
    assert 0 < busiest.kv_cache_usage <= 1
    _assert_fast_gauges(measured.gauges)
    assert after.ttft_p95_ms is not None
    assert 80 < after.ttft_p95_ms <= 100
    assert after.itl_p95_ms is not None
    assert 10 < after.itl_p95_ms <= 25
    assert after.preemption_rate is None  # the simulator exports no preemption counter
    assert after.gpu_utilization is None  # no DCGM here
    assert 0 <= age < 3

    assert idle_after is not None
    assert (idle_after.request_rate, idle_after.prompt_tokens_rate) == (0.0, 0.0)
    assert (idle_after.running, idle_after.waiting, idle_after.kv_cache_usage) == (0, 0, 0)
    assert (idle_after.ttft_p95_ms, idle_after.itl_p95_ms) == (None, None)
    assert idle_after.invalid() == ""


# (histogram, latency s, rounding, share over): the simulator's TTFT is 100 ms and its token
# gap 25 ms, exactly, so each reading is all or nothing; 90 and 20 ms are no bucket boundary.
GOODPUT = [
    pytest.param("ttft", 0.1, Round.UP, 0.0, id="ttft-at-its-boundary-none-over"),
    pytest.param("ttft", 0.08, Round.UP, 1.0, id="ttft-boundary-below-all-over"),
    pytest.param("ttft", 0.09, Round.UP, 0.0, id="ttft-misses-read-at-the-next-boundary"),
    pytest.param("ttft", 0.09, Round.DOWN, 1.0, id="ttft-comfort-read-at-the-previous-one"),
    pytest.param("itl", 0.025, Round.UP, 0.0, id="itl-at-its-boundary-none-over"),
    pytest.param("itl", 0.02, Round.UP, 0.0, id="itl-misses-read-at-the-next-boundary"),
    pytest.param("itl", 0.02, Round.DOWN, 1.0, id="itl-comfort-read-at-the-previous-one"),
    pytest.param("itl", 0.01, Round.UP, 1.0, id="itl-boundary-below-all-over"),
]


@pytest.fixture(scope="module")
def goodput_load(
    prometheus_binary: Path, sim_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[PoolSignals, Load]:
    """Two unified engines under load for a rate window, read after a scrape that followed it."""
    unified = EngineSpec("ns", "chat", "unified", LATENCY)
    directory = tmp_path_factory.mktemp("goodput")
    return _loaded_window(prometheus_binary, sim_binary, directory, unified, unified)


def _loaded_window(
    prometheus_binary: Path, sim_binary: Path, directory: Path, *specs: EngineSpec
) -> tuple[PoolSignals, Load]:
    """Engines (one unified pool) under load for a rate window, read at the first scrape after
    the last request; the load's `read_at` is when."""
    with (
        Prometheus(prometheus_binary, directory) as prometheus,
        engines(sim_binary, *specs) as started,
    ):
        prometheus.set_targets(started)
        prometheus.wait_scraped(started)
        signals = PrometheusSignals(prometheus.url, rate_window=f"{WINDOW_S}s")
        load = Load(started)
        with load.running():
            time.sleep(WINDOW_S)
        ended = datetime.now(UTC)
        found = wait_for(
            lambda: f
            if (f := signals.read("ns", "chat", ["unified"]).get("unified"))
            and f.observed_at > ended
            else None,
            15, "a scrape after the last request",
        )  # fmt: skip
        load.read_at = time.monotonic()  # before the engines' and Prometheus' shutdown
    return found, load


@pytest.mark.parametrize(("which", "latency_s", "rounding", "share"), GOODPUT)
def test_goodput_from_a_real_prometheus(
    goodput_load: tuple[PoolSignals, Load],
    which: str,
    latency_s: float,
    rounding: Round,
    share: float,
) -> None:
    found, _ = goodput_load
    histogram = found.ttft_histogram if which == "ttft" else found.itl_histogram
    assert histogram is not None
    late = over(histogram, latency_s, rounding)
    assert late.total > 0
    assert late.share == pytest.approx(share)


def test_goodput_counts_each_request_once(goodput_load: tuple[PoolSignals, Load]) -> None:
    found, load = goodput_load
    assert found.ttft_histogram is not None
    assert found.itl_histogram is not None
    assert found.invalid() == ""
    # Every request of the window has one TTFT; the simulator's ITL histogram counts token gaps
    # (it exports no per-request one, so the fallback is read, and only one of its two names:
    # both carry the same gaps, and two would count each twice).
    # Prometheus' newest sample is up to a scrape (1 s) behind the read.
    window = load.rate(load.read_at - WINDOW_S - 1, load.read_at - 1) * WINDOW_S
    assert found.ttft_histogram.total == pytest.approx(window, rel=0.4)
    gaps = sum(out - 1 for _, _, out in load.done) / len(load.done)
    assert found.itl_histogram.total == pytest.approx(found.ttft_histogram.total * gaps, rel=0.3)
    # The simulator times its prefill phase (the TTFT it sleeps) once per request, like vLLM.
    assert found.prefill_histogram is not None
    assert found.prefill_histogram.total == pytest.approx(found.ttft_histogram.total, rel=0.3)


def test_prefill_bound_misses_from_a_real_prometheus(
    prometheus_binary: Path, sim_binary: Path, tmp_path: Path
) -> None:
    """An engine whose prefill alone takes 600 ms: every TTFT is over a 500 ms target, and the
    prefill-time histogram, read through the same query, says each of them is the prompt's own
    (vLLM's TTFT and request-latency buckets share the 0.5 s bound)."""
    slow = EngineSpec("ns", "chat", "unified", ("--time-to-first-token", "600ms"))
    found, _ = _loaded_window(prometheus_binary, sim_binary, tmp_path, slow)
    assert found.ttft_histogram is not None
    late = over(found.ttft_histogram, 0.5, Round.UP)
    assert late.total > 0
    assert late.share == 1.0
    left = capacity_misses(late, found.prefill_histogram)
    # Both series are extrapolated by increase() on their own: equal up to float noise.
    assert left.prefill_bound == pytest.approx(late.over, rel=0.05)
    assert left.share < 0.05


class _Dcgm(BaseHTTPRequestHandler):
    """A stand-in for dcgm-exporter: two GPUs of one pod, 70 % and 30 % busy."""

    pod = ""

    def do_GET(self) -> None:
        labels = f'namespace="ns",pod="{self.pod}"'
        body = "".join(
            f'DCGM_FI_DEV_GPU_UTIL{{gpu="{gpu}",{labels}}} {value}\n'
            for gpu, value in ((0, 70), (1, 30))
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


def test_pools_without_series_are_absent_and_gpu_utilisation_joins_on_the_pod(
    prometheus: Prometheus, sim_binary: Path
) -> None:
    signals = PrometheusSignals(prometheus.url, rate_window=f"{WINDOW_S}s")
    with engines(sim_binary, EngineSpec("ns", "chat", "unified")) as started:
        _Dcgm.pod = started[0].pod
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Dcgm)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            dcgm = Target(f"127.0.0.1:{server.server_address[1]}")
            prometheus.set_targets(started, [dcgm])
            prometheus.wait_scraped(started)

            def joined() -> PoolSignals | None:
                found = signals.read("ns", "chat", ["unified"]).get("unified")
                return found if found and found.gpu_utilization is not None else None

            unified = wait_for(joined, 30, "the GPU utilisation")
            assert unified.gpu_utilization == pytest.approx(0.5)
            assert signals.read("ns", "chat", ["prefill", "decode"]) == {}
            assert signals.read("ns", "ghost", ["unified"]) == {}
            assert signals.read("other", "chat", ["unified"]) == {}
            assert list(signals.read_all()) == [PoolKey("ns", "chat", "unified")]
            # The autoscaler's pass: every service in one query, each its own pools.
            both = signals.read_services(
                {("ns", "chat"): ["unified"], ("other", "chat"): ["unified"]}
            )
            assert both[("ns", "chat")]["unified"].gpu_utilization == pytest.approx(0.5)
            assert both[("other", "chat")] == {}
            gauges = signals.read_services_gauges({("ns", "chat"): ["unified", "decode"]})
            assert list(gauges[("ns", "chat")]) == ["unified"]

            # Engines gone from discovery: their series are marked stale at once.
            prometheus.set_targets([], [dcgm])
            wait_for(lambda: signals.read_all() == {} or None, 30, "the pool to disappear")
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)


def test_an_unreachable_prometheus_is_signals_unavailable(prometheus: Prometheus) -> None:
    signals = PrometheusSignals(prometheus.url, timeout_s=2)
    assert signals.read_all() == {}
    prometheus.stop()
    started = time.monotonic()
    with pytest.raises(SignalsUnavailable, match=f"Prometheus at {prometheus.url}"):
        signals.read_all()
    assert time.monotonic() - started < 2  # refused at once, no retries with backoff


def test_a_query_prometheus_refuses_is_signals_unavailable(prometheus: Prometheus) -> None:
    signals = PrometheusSignals(prometheus.url, rate_window="5s", mean_window="0s")
    with pytest.raises(SignalsUnavailable, match="400"):
        signals.read_all()


URI_LIMIT = 8192
"""nginx's default `large_client_header_buffers`: the longest request line it accepts."""


def test_a_full_pass_whose_queries_a_url_could_not_carry_reads_through_a_proxy(
    prometheus: Prometheus, sim_binary: Path
) -> None:
    """40 services of one namespace, read in chunks of 20 (the chart's 100, scaled down): each
    chunk's query selects its services by a regex of their names in every signal, ~11 KB
    encoded, more than a proxy in front of Prometheus passes in a URL. The pass sends it in a
    POST body; the same query in the URL (as `prometheus_api_client.custom_query` sent it
    before issue 28) is refused with 414."""
    names = [f"chat-{number:02d}" for number in range(40)]
    wanted = {("ns", name): ["unified"] for name in names}
    with (
        engines(sim_binary, EngineSpec("ns", names[0], "unified")) as (engine,),
        UriLimit(prometheus.url, URI_LIMIT) as proxy,
    ):
        # One engine scraped as each service's pod: a target per service, with its labels.
        prometheus.set_targets(
            [
                Target(engine.target.address, {**engine.target.labels,
                       "llmfleet_dev_service": name, "pod": f"{name}-0"})
                for name in names
            ]
        )  # fmt: skip
        signals = PrometheusSignals(proxy.url, chunk_services=20)
        queries = [
            combined_query(signal_queries(signals.options, chunk.match))
            for chunk in chunks(wanted, signals.chunk_services)
        ]
        assert len(queries) == 2
        assert all(len(f"GET /api/v1/query?{urlencode({'query': q})}") > URI_LIMIT for q in queries)

        def every_pool() -> dict[ServiceKey, dict[str, PoolSignals]] | None:
            read = signals.read_services(wanted)
            found = {key: pools for key, pools in read.items() if isinstance(pools, dict)}
            return found if all(found.get(key) for key in wanted) else None

        try:
            read = wait_for(every_pool, 30, "every service's pool through the proxy")
        finally:
            signals.close()
        assert sorted(read) == sorted(wanted)
        assert proxy.refused == []
        in_url = httpx.get(f"{proxy.url}/api/v1/query", params={"query": queries[0]})
        assert in_url.status_code == 414
        assert len(proxy.refused) == 1
        # Prometheus itself takes the long URL: the limit is the proxy's.
        direct = httpx.get(f"{prometheus.url}/api/v1/query", params={"query": queries[0]})
        assert direct.json()["status"] == "success"
