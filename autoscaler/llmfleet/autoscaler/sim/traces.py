"""Request traces the simulator replays: the Azure LLM inference CSV and Mooncake JSONL.

- Azure (`*.csv`): header `TIMESTAMP,ContextTokens,GeneratedTokens`; timestamps such as
  `2023-11-16 18:17:03.9799600` (seven fractional digits; cut to microseconds). No prompt
  content, so no prefix sharing is known.
- Mooncake (`*.jsonl`): one object a line with `timestamp` (ms), `input_length`,
  `output_length` and `hash_ids`, the prompt's 512-token blocks (equal ids = the same prefix
  blocks, so the same KV cache).

Arrival times are seconds from the trace's first request. A line that cannot be read raises
`TraceError` (a `UserError`) naming the file and the 1-based line number.

The repository ships both public traces in `data/traces/` (`shipped()`); `TRACES_DIR_ENV` points
elsewhere.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from llmfleet.core.errors import UserError

MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per `hash_ids` block in the Mooncake traces (FAST'25 release README)."""
_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
SUFFIXES = (".csv", ".jsonl")

TRACES_DIR_ENV = "LLMFLEET_TRACES_DIR"
"""A folder of traces read instead of the repository's `data/traces/`."""


class TraceError(UserError):
    """A trace that cannot be read, with the place (file:line) and what is wrong."""


@dataclass(frozen=True, slots=True)
class Request:
    arrival: float
    """Seconds since the first request of the trace."""
    prompt_tokens: int
    output_tokens: int
    blocks: tuple[int, ...] = ()
    """Prefix block hashes (Mooncake `hash_ids`); empty when the trace has none."""


@dataclass(frozen=True)
class Trace:
    name: str
    kind: str
    """`azure` or `mooncake`."""
    requests: tuple[Request, ...]
    block_tokens: int = MOONCAKE_BLOCK_TOKENS

    @property
    def duration(self) -> float:
        return self.requests[-1].arrival if self.requests else 0.0

    @property
    def mean_prompt_tokens(self) -> float:
        return sum(r.prompt_tokens for r in self.requests) / max(len(self.requests), 1)

    @property
    def mean_output_tokens(self) -> float:
        return sum(r.output_tokens for r in self.requests) / max(len(self.requests), 1)


def prefix_upper_bound(trace: Trace) -> float:
    """Share of the prompt tokens an infinite prefix cache shared by every pod would serve: each
    request's longest run of leading blocks seen in any earlier request (at least one token is
    always computed, as in the engine), over all prompt tokens. 0 for a trace without blocks."""
    seen: set[int] = set()
    hits = total = 0
    for request in trace.requests:
        total += request.prompt_tokens
        run = 0
        for block in request.blocks:
            if block not in seen:
                break
            run += 1
        hits += min(run * trace.block_tokens, request.prompt_tokens - 1)
        seen.update(request.blocks)
    return hits / total if total else 0.0


def shipped_dir() -> Path:
    """`$LLMFLEET_TRACES_DIR`, else `data/traces/` of the checkout llmfleet runs from: the
    nearest folder above this module holding `pyproject.toml` (an editable install, as `make`
    sets up; an installed wheel carries no traces and needs the variable)."""
    override = os.environ.get(TRACES_DIR_ENV, "").strip()
    if override:
        return Path(override)
    here = Path(__file__).resolve().parent
    for folder in here.parents:
        if (folder / "pyproject.toml").is_file():
            return folder / "data" / "traces"
    raise TraceError(
        f"no trace folder: llmfleet is not running from a checkout (no pyproject.toml above "
        f"{here}); name trace files or set {TRACES_DIR_ENV}"
    )


def shipped() -> list[Path]:
    """Every trace in `shipped_dir()`, sorted by name; a missing or empty folder is a
    `TraceError`, never an empty list (a replay of nothing would look like success)."""
    folder = shipped_dir()
    if not folder.is_dir():
        raise TraceError(
            f"{folder}: no such trace folder (name trace files or set {TRACES_DIR_ENV})"
        )
    paths = sorted(p for p in folder.iterdir() if p.suffix in SUFFIXES and p.is_file())
    if not paths:
        raise TraceError(f"{folder}: no .csv or .jsonl trace in the folder")
    return paths


def load(path: Path, *, limit_s: float | None = None) -> Trace:
    """The trace at `path` (format by suffix: `.csv` Azure, `.jsonl` Mooncake), sorted by
    arrival; `limit_s` keeps only the first seconds."""
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file")
    suffix = path.suffix.lower()
    if suffix == ".csv":
        kind, requests = "azure", _azure(path)
    elif suffix in (".jsonl", ".json"):
        kind, requests = "mooncake", _mooncake(path)
    else:
        raise TraceError(
            f"{path}: unknown trace format {suffix!r} (expected .csv for Azure, "
            ".jsonl for Mooncake)"
        )
    if not requests:
        raise TraceError(f"{path}: the trace has no requests")
    requests.sort(key=lambda r: r.arrival)
    start = requests[0].arrival
    shifted = [
        Request(r.arrival - start, r.prompt_tokens, r.output_tokens, r.blocks) for r in requests
    ]
    if limit_s is not None:
        shifted = [r for r in shifted if r.arrival <= limit_s]
    return Trace(path.name, kind, tuple(shifted))


def _count(value: Any, what: str, where: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TraceError(f"{where}: {what} must be an integer, got {value!r}")
    try:
        number = int(value)
    except ValueError:
        raise TraceError(f"{where}: {what} must be an integer, got {value!r}") from None
    if number < minimum:
        raise TraceError(f"{where}: {what} must be at least {minimum}, got {number}")
    return number


def _azure(path: Path) -> list[Request]:
    requests: list[Request] = []
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None or tuple(h.strip() for h in header) != _AZURE_COLUMNS:
            raise TraceError(
                f"{path}:1: expected the header {','.join(_AZURE_COLUMNS)}, got {header!r}"
            )
        for row in reader:
            where = f"{path}:{reader.line_num}"
            if not row:
                continue
            if len(row) != 3:
                raise TraceError(f"{where}: expected 3 columns, got {len(row)}: {row!r}")
            stamp = row[0].strip()
            try:
                # Python reads at most 6 fractional digits; the trace has 7.
                head, _, fraction = stamp.partition(".")
                when = datetime.fromisoformat(f"{head}.{fraction[:6]}" if fraction else head)
            except ValueError:
                raise TraceError(f"{where}: TIMESTAMP is not a date and time: {stamp!r}") from None
            requests.append(
                Request(
                    when.timestamp(),
                    _count(row[1].strip(), "ContextTokens", where, 1),
                    _count(row[2].strip(), "GeneratedTokens", where, 1),
                )
            )
    return requests


def _mooncake(path: Path) -> list[Request]:
    requests: list[Request] = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            where = f"{path}:{number}"
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as error:
                raise TraceError(f"{where}: not JSON ({error.msg})") from None
            if not isinstance(item, dict):
                raise TraceError(f"{where}: expected a JSON object, got {type(item).__name__}")
            missing = [k for k in ("timestamp", "input_length", "output_length") if k not in item]
            if missing:
                raise TraceError(f"{where}: missing {', '.join(missing)}")
            stamp = item["timestamp"]
            if isinstance(stamp, bool) or not isinstance(stamp, int | float) or stamp < 0:
                raise TraceError(f"{where}: timestamp must be milliseconds >= 0, got {stamp!r}")
            hashes = item.get("hash_ids", [])
            if not isinstance(hashes, list) or not all(
                isinstance(h, int) and not isinstance(h, bool) for h in hashes
            ):
                raise TraceError(f"{where}: hash_ids must be a list of integers")
            requests.append(
                Request(
                    float(stamp) / 1000.0,
                    _count(item["input_length"], "input_length", where, 1),
                    _count(item["output_length"], "output_length", where, 1),
                    tuple(hashes),
                )
            )
    return requests
