"""Tables of bench/gateway_overhead.py: one per figure, rows = metrics, columns = targets.

Each cell is the median over rounds of a per-round figure. An "added" row shows, per round, the
target's statistic minus direct's of the same round, then the median of those; direct's own
column shows its absolute value. A figure taken while more than 1% of the phase's requests
failed or were dropped (the target could not keep up) is marked with "!".
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

TROUBLE_SHARE = 0.01
WIDTH = 14


@dataclass
class Measured:
    """One phase against one target in one round: named figures, and whether it was in trouble."""

    values: dict[str, float] = field(default_factory=dict)
    trouble: bool = False


Rounds = list[dict[str, dict[str, Measured]]]
"""Per round: phase -> target name -> Measured."""


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value * 1000:.2f} ms"


def added_ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value * 1000:+.2f} ms"


def count(value: float) -> str:
    return f"{value:.0f}"


def percent(value: float) -> str:
    return f"{value * 100:.0f}%"


@dataclass
class Row:
    label: str
    phase: str
    metric: str
    unit: Callable[[float], str]
    added: bool = False
    """Show target - direct (direct itself absolute)."""
    ratio: bool = False
    """Also show the target's value as a share of direct's."""
    direct: bool = True
    """Whether direct has this figure (CPU of a proxy: it has not)."""


def table(
    title: str, rows: list[Row], rounds: Rounds, columns: list[str], absent: dict[str, str]
) -> str:
    lines = [title, f"  {'':<30}" + "".join(f"{name:>{WIDTH}}" for name in columns)]
    for row in rows:
        cells = [_cell(row, rounds, name, absent) for name in columns]
        lines.append(f"  {row.label:<30}" + "".join(f"{cell:>{WIDTH}}" for cell in cells))
    for name, reason in absent.items():
        lines.append(f"  {name}: n/a: {reason}")
    return "\n".join(lines)


def _cell(row: Row, rounds: Rounds, name: str, absent: dict[str, str]) -> str:
    if name in absent:
        return "n/a"
    if name == "direct" and not row.direct:
        return "-"
    per_round = [r[row.phase] for r in rounds if name in r.get(row.phase, {})]
    if not per_round:
        return "-"
    values = [m[name].values.get(row.metric, float("nan")) for m in per_round]
    trouble = "!" if any(m[name].trouble for m in per_round) else ""
    if row.added and name != "direct":
        directs = [m["direct"].values.get(row.metric, float("nan")) for m in per_round]
        return (
            added_ms(statistics.median(v - d for v, d in zip(values, directs, strict=True)))
            + trouble
        )
    value = statistics.median(values)
    text = row.unit(value) + trouble
    if row.ratio and name != "direct":
        direct = statistics.median(m["direct"].values[row.metric] for m in per_round)
        text += f" ({value / direct:.2f}x)" if direct else ""
    return text


@dataclass
class Pauses:
    """Garbage collection pauses (seconds) seen during one phase, pooled over rounds."""

    durations: list[float] = field(default_factory=list)
    full: list[float] = field(default_factory=list)
    """Generation 2 (full) collections only."""


def pause_table(
    title: str, phases: dict[str, dict[str, Pauses]], rounds: int, names: list[str]
) -> str:
    """Rows per phase: collections per round, p50, p99 and max pause; columns = `names`."""
    lines = [title, f"  {'':<30}" + "".join(f"{name:>{WIDTH}}" for name in names)]
    for phase, by_name in phases.items():
        figures: list[tuple[str, Callable[[Pauses], str]]] = [
            ("collections/round", lambda p: f"{len(p.durations) / rounds:.0f}"),
            ("pause p50", lambda p: ms(quantile(p.durations, 0.5))),
            ("pause p99", lambda p: ms(quantile(p.durations, 0.99))),
            ("pause max", lambda p: ms(max(p.durations, default=float("nan")))),
            ("full (gen 2)/round", lambda p: f"{len(p.full) / rounds:.1f}"),
            ("full max", lambda p: ms(max(p.full, default=float("nan")))),
        ]
        for label, figure in figures:
            cells = [figure(by_name[name]) if name in by_name else "-" for name in names]
            lines.append(f"  {phase + ' ' + label:<30}" + "".join(f"{c:>{WIDTH}}" for c in cells))
    return "\n".join(lines)


def histogram_quantiles(buckets: dict[float, float]) -> tuple[float, float, float, float]:
    """(count, p50, p99, max) of a Prometheus histogram's cumulative buckets {le: count}, each
    quantile as the upper bound of the bucket it falls in (max: the lowest bound holding all)."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0.0

    def upper(share: float) -> float:
        for bound in bounds:
            if buckets[bound] >= share * total:
                return bound
        return float("nan")

    return total, upper(0.5), upper(0.99), upper(1.0)


@dataclass
class Ledger:
    """When each phase ran against each llmfleet gateway, and its own GC histogram's growth."""

    windows: list[tuple[str, str, float, float]] = field(default_factory=list)
    """(target, phase, start, end) on time.monotonic()."""
    histograms: dict[str, dict[str, list[dict[float, float]]]] = field(default_factory=dict)
    """phase -> target -> the histogram's increase over each round's phase."""


def report(
    rounds: Rounds,
    columns: list[str],
    absent: dict[str, str],
    *,
    ledger: Ledger,
    pauses: dict[str, list[tuple[float, int, float]]],
    args: argparse.Namespace,
) -> str:
    """Every table of the run; `args` are gateway_overhead.py's (phases and their settings)."""
    missing = {name: why for name, why in absent.items() if name != "oha"}
    rates = [f"{rate:g} req/s" for rate in args.rates]
    stream = f"{args.stream_rate:g} streams/s"
    prompt = f"{args.prompt_tokens} tokens"
    loads = [*rates, stream, "closed loop", prompt]
    tables = [
        table(
            "\nNon-streaming chat completions, open-loop Poisson: latency (direct) and added "
            "(proxy minus direct)",
            [
                row
                for rate in rates
                for row in (
                    Row(f"{rate} p50", rate, "p50", ms, added=True),
                    Row(f"{rate} p99", rate, "p99", ms, added=True),
                    Row(f"{rate} failed or dropped", rate, "failed", count),
                )
            ],
            rounds,
            columns,
            missing,
        ),
        table(
            f"\nStreaming chat completions, open-loop Poisson at {stream} ({args.stream_chunks} "
            f"chunks {args.chunk_interval_ms:g} ms apart): time to first event, added",
            [
                Row("TTFT p50", stream, "ttft50", ms, added=True),
                Row("TTFT p99", stream, "ttft99", ms, added=True),
                Row("whole stream p50", stream, "p50", ms, added=True),
                Row("whole stream p99", stream, "p99", ms, added=True),
                Row("failed or dropped", stream, "failed", count),
            ],
            rounds,
            columns,
            missing,
        ),
        table(
            f"\nMaximum requests/s on one core: closed loop, oha with {args.connections} "
            "connections (proxy core under ~90% busy: bound by the engines' or client's core)",
            [
                Row("requests/s", "closed loop", "rps", count, ratio=True),
                Row("latency p50", "closed loop", "p50", ms),
                Row("latency p99", "closed loop", "p99", ms),
                Row("proxy core busy", "closed loop", "busy", percent, direct=False),
                Row("others on proxy core", "closed loop", "others", percent),
                Row("failed", "closed loop", "failed", count),
            ],
            rounds,
            columns,
            absent if "oha" in absent else missing,
        ),
        table(
            f"\n/v1/completions with a {args.prompt_tokens}-token-id prompt, one at a time: "
            f"median of {args.prompt_repeats}",
            [
                Row("latency (added)", prompt, "median", ms, added=True),
                Row("failed", prompt, "failed", count),
            ],
            rounds,
            columns,
            missing,
        ),
        table(
            "\nCPU per request: the proxy process's CPU time over the phase / requests sent; "
            "core busy: that CPU time / the phase's wall time; others on core: the proxy core's "
            "time used by other processes (idle proxies, other people's: noise) or stolen",
            [Row(f"{load} CPU/request", load, "cpu", ms, direct=False) for load in loads]
            + [Row(f"{load} core busy", load, "busy", percent, direct=False) for load in loads]
            + [Row(f"{load} others on core", load, "others", percent) for load in loads],
            rounds,
            columns,
            missing,
        ),
    ]
    tables.append(gc_report(pauses, ledger, args.rounds))
    return "\n".join(tables)


def gc_report(
    pauses: dict[str, list[tuple[float, int, float]]], ledger: Ledger, rounds: int
) -> str:
    """Pauses per phase from the collection logs, and the gateways' own histogram if any."""
    logged: dict[str, dict[str, Pauses]] = {}
    for name, phase, start, end in ledger.windows:
        phase_pauses = logged.setdefault(phase, {}).setdefault(name, Pauses())
        for at, generation, seconds in pauses.get(name, []):
            if start <= at < end:
                phase_pauses.durations.append(seconds)
                if generation == 2:
                    phase_pauses.full.append(seconds)
    text = pause_table(
        "\nGarbage collection pauses in the llmfleet gateways (bench/gc_probe.py: every "
        "collection timed through gc.callbacks)",
        logged,
        rounds,
        list(pauses),
    )
    lines = [text]
    for phase, by_name in ledger.histograms.items():
        for name, grown in by_name.items():
            merged: dict[float, float] = {}
            for histogram in grown:
                for le, number in histogram.items():
                    merged[le] = merged.get(le, 0.0) + number
            total, p50, p99, top = histogram_quantiles(merged)
            seen = f"p50 <= {ms(p50)}, p99 <= {ms(p99)}, max <= {ms(top)}" if total else "none"
            lines.append(
                f"  {name} {phase}: llmfleet_gateway_gc_pause_seconds {total / rounds:.0f} "
                f"per round, {seen}"
            )
    if len(lines) == 1:
        lines.append("  (no gateway exports llmfleet_gateway_gc_pause_seconds)")
    return "\n".join(lines)
