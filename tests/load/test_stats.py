"""`llmfleet load`'s figures: counts, percentiles, attainment as `llmfleet sim` counts it, errors
by kind, and the table and JSON they become."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from llmfleet.autoscaler.sim.load.report import as_json, tables
from llmfleet.autoscaler.sim.load.stats import DROPPED, Outcome, Slo, summarize


def ok(index: int, ttft_ms: float, *gaps_ms: float, sent_ms: float = 0.0) -> Outcome:
    return Outcome(
        index,
        scheduled_s=0.0,
        sent_s=sent_ms / 1000,
        ttft_s=ttft_ms / 1000,
        gaps_s=tuple(g / 1000 for g in gaps_ms),
        output_tokens=len(gaps_ms) + 1,
        prompt_tokens=100,
        prompt_tokens_counted=100,
    )


def failed(index: int, kind: str) -> Outcome:
    return Outcome(index, 0.0, 0.0, kind, prompt_tokens=100)


def dropped(index: int) -> Outcome:
    return Outcome(index, 0.0, None, DROPPED, prompt_tokens=100)


OUTCOMES = [
    ok(0, 100, 10, 10, sent_ms=5),  # mean gap 10 ms
    ok(1, 300, 10, 50, sent_ms=15),  # mean gap 30 ms
    ok(2, 200),  # one chunk: no gap, within any ITL target
    failed(3, "http 429 rate_limit_error"),
    failed(4, "timeout"),
    failed(5, "http 429 rate_limit_error"),
    dropped(6),
]


def test_counts_and_errors_by_kind() -> None:
    summary = summarize(OUTCOMES, Slo(), wall_s=2.0)
    assert (summary.planned, summary.sent, summary.ok, summary.failed, summary.dropped) == (
        7,
        6,
        3,
        3,
        1,
    )
    assert summary.errors == {"http 429 rate_limit_error": 2, DROPPED: 1, "timeout": 1}
    assert summary.output_tokens == 3 + 3 + 1
    assert summary.requests_per_s == 1.5
    assert summary.prompt_token_ratio == 1.0


def test_percentiles_over_answers_and_pooled_gaps() -> None:
    summary = summarize(OUTCOMES, Slo(), wall_s=2.0)
    assert summary.ttft_ms is not None
    assert summary.ttft_ms.p50 == 200.0
    assert (summary.ttft_ms.p95, summary.ttft_ms.p99) == pytest.approx((290.0, 298.0))
    assert summary.itl_ms is not None
    assert summary.itl_ms.p50 == 10.0  # gaps 10, 10, 10, 50
    assert summary.itl_ms.p99 == pytest.approx(48.8)
    assert summary.send_lag_ms is not None
    assert summary.send_lag_ms.p50 == pytest.approx(0.0)  # the failed ones left on time
    assert summary.send_lag_ms.p99 == pytest.approx(14.5)


@pytest.mark.parametrize(
    ("slo", "ttft_pct", "itl_pct"),
    [
        pytest.param(Slo(), None, None, id="no-targets"),
        # Six sent: three answered; the three failures miss both, the drop counts in neither.
        pytest.param(Slo(ttft_ms=250), 200 / 6, None, id="ttft-only"),
        pytest.param(Slo(ttft_ms=300, itl_ms=20), 300 / 6, 200 / 6, id="both"),
        pytest.param(Slo(ttft_ms=50, itl_ms=31), 0.0, 300 / 6, id="itl-by-mean-gap-not-max"),
    ],
)
def test_attainment(slo: Slo, ttft_pct: float | None, itl_pct: float | None) -> None:
    summary = summarize(OUTCOMES, slo, wall_s=2.0)
    assert summary.ttft_attainment_pct == (None if ttft_pct is None else pytest.approx(ttft_pct))
    assert summary.itl_attainment_pct == (None if itl_pct is None else pytest.approx(itl_pct))


def test_nothing_answered_has_no_percentiles() -> None:
    summary = summarize([failed(0, "connection"), dropped(1)], Slo(ttft_ms=100), wall_s=1.0)
    assert (summary.ttft_ms, summary.itl_ms, summary.prompt_token_ratio) == (None, None, None)
    assert summary.ttft_attainment_pct == 0.0
    assert summary.requests_per_s == 0.0


def test_prompt_token_ratio_compares_what_the_engine_counted() -> None:
    answers = [
        Outcome(0, 0.0, 0.0, ttft_s=0.1, prompt_tokens=100, prompt_tokens_counted=150),
        Outcome(1, 0.0, 0.0, ttft_s=0.1, prompt_tokens=300, prompt_tokens_counted=450),
        Outcome(2, 0.0, 0.0, ttft_s=0.1, prompt_tokens=999),  # no usage: not counted
    ]
    assert summarize(answers, Slo(), 1.0).prompt_token_ratio == 1.5


def _render(slo: Slo) -> str:
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(tables(summarize(OUTCOMES, slo, wall_s=2.0), "title"))
    return console.export_text()


def test_the_table_shows_slo_columns_only_with_a_target() -> None:
    without, with_slo = _render(Slo()), _render(Slo(ttft_ms=300))
    assert "within SLO" not in without
    assert "within SLO" in with_slo
    assert "50.00%" in with_slo  # TTFT: 3 of 6 within 300 ms
    for text in (without, with_slo):
        assert "http 429 rate_limit_error" in text
        assert DROPPED in text
        assert "200.0 ms" in text  # TTFT p50


def test_json_has_the_same_figures() -> None:
    document = as_json(summarize(OUTCOMES, Slo(itl_ms=20), wall_s=2.0), model="m")
    assert json.loads(json.dumps(document)) == document  # plain JSON types only
    assert document["model"] == "m"
    assert document["requests"] == {"planned": 7, "sent": 6, "ok": 3, "failed": 3, "dropped": 1}
    assert document["ttftMs"]["p50"] == 200.0
    assert document["itlAttainmentPct"] == pytest.approx(200 / 6)
    assert document["ttftAttainmentPct"] is None
    assert document["errors"]["timeout"] == 1
