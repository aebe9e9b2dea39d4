"""What `llmfleet load` prints at the end: tables for a person, the same figures as JSON."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from llmfleet.autoscaler.sim.load.stats import Percentiles, Summary


def _ms(value: float) -> str:
    return f"{value / 1000:.2f} s" if value >= 10_000 else f"{value:.1f} ms"


def tables(summary: Summary, title: str) -> Group:
    """The title line, then tables: requests, latency (with SLO columns only when a target is
    known) and errors by kind (when there are any)."""
    counts = Table()
    for column in ("sent", "ok", "failed", "dropped", "ok/s", "output tok/s", "send lag p99"):
        counts.add_column(column, justify="right")
    lag = summary.send_lag_ms
    counts.add_row(
        str(summary.sent),
        str(summary.ok),
        str(summary.failed),
        str(summary.dropped),
        f"{summary.requests_per_s:.2f}",
        f"{summary.output_tokens_per_s:.0f}",
        _ms(lag.p99) if lag else "-",
    )

    latency = Table()
    latency.add_column("latency")
    for column in ("p50", "p95", "p99"):
        latency.add_column(column, justify="right")
    with_slo = summary.slo.ttft_ms is not None or summary.slo.itl_ms is not None
    if with_slo:
        latency.add_column("SLO", justify="right")
        latency.add_column("within SLO", justify="right")
    rows = (
        ("TTFT", summary.ttft_ms, summary.slo.ttft_ms, summary.ttft_attainment_pct),
        ("ITL", summary.itl_ms, summary.slo.itl_ms, summary.itl_attainment_pct),
    )
    for name, figures, target, attained in rows:
        cells = [_ms(v) for v in (figures.p50, figures.p95, figures.p99)] if figures else ["-"] * 3
        if with_slo:
            cells.append("-" if target is None else _ms(target))
            cells.append("-" if attained is None else f"{attained:.2f}%")
        latency.add_row(name, *cells)

    parts: list[Table | Text] = [Text(title), counts, latency]
    if summary.errors:
        errors = Table()
        errors.add_column("error")
        errors.add_column("requests", justify="right")
        for kind, count in summary.errors.items():
            errors.add_row(kind, str(count))
        parts.append(errors)
    return Group(*parts)


def _percentiles(figures: Percentiles | None) -> dict[str, float] | None:
    if figures is None:
        return None
    return {"p50": figures.p50, "p95": figures.p95, "p99": figures.p99}


def as_json(summary: Summary, **context: Any) -> dict[str, Any]:
    """The summary's figures (milliseconds, percents) after the given `context` keys."""
    return {
        **context,
        "requests": {
            "planned": summary.planned,
            "sent": summary.sent,
            "ok": summary.ok,
            "failed": summary.failed,
            "dropped": summary.dropped,
        },
        "wallSeconds": summary.wall_s,
        "okPerSecond": summary.requests_per_s,
        "outputTokens": summary.output_tokens,
        "outputTokensPerSecond": summary.output_tokens_per_s,
        "ttftMs": _percentiles(summary.ttft_ms),
        "itlMs": _percentiles(summary.itl_ms),
        "slo": {"ttftMs": summary.slo.ttft_ms, "itlMs": summary.slo.itl_ms},
        "ttftAttainmentPct": summary.ttft_attainment_pct,
        "itlAttainmentPct": summary.itl_attainment_pct,
        "errors": summary.errors,
        "sendLagMs": _percentiles(summary.send_lag_ms),
        "promptTokenRatio": summary.prompt_token_ratio,
    }
