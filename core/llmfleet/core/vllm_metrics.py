"""vLLM's Prometheus text exposition, read for only the series a caller names.

The one parser of an engine's /metrics in llmfleet: the gateway's scraper (load for routing), the
operator's drain probe and the runtime launcher (drain, profiler) all read through `read`. It
takes the text format vLLM's prometheus_client and llm-d-inference-sim write (version 0.0.4):

    # HELP / # TYPE comments, blank lines
    name value [timestamp]
    name{label="value",...} value [timestamp]

A value is a float, `NaN`, `+Inf` or `-Inf`; a label value may hold spaces, `}`, `#` and the
escapes `\\\\`, `\\"` and `\\n`. A histogram's series are asked for by their own names
(`..._bucket`, `..._sum`, `..._count`), a counter's by its `_total` name. Lines that do not parse
are skipped, never raised on: an engine's exposition is not ours to enforce. Not read:
OpenMetrics exemplars (we never ask for that format) and lines that start with blanks.

Cost: each asked-for name is found with `str.find` over the whole text, a loop in C, so lines of
other series are never split, matched or even visited in Python. That matters to the gateway,
which scrapes every engine every interval: vLLM exposes ~300 lines and the router wants three.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import NamedTuple

RUNNING = "vllm:num_requests_running"
"""Gauge: requests in the engine's running batch."""
WAITING = "vllm:num_requests_waiting"
"""Gauge: requests queued for the running batch."""
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
"""Gauge: fraction of the KV cache's blocks in use (0-1)."""
GPU_CACHE_USAGE = "vllm:gpu_cache_usage_perc"
"""`KV_CACHE_USAGE`'s name before vLLM 0.9 (deprecated there, still exported by some engines)."""
CACHE_CONFIG_INFO = "vllm:cache_config_info"
"""Info gauge (value 1): its labels carry `num_gpu_blocks`, `block_size`, `cache_dtype`, ..."""

_LABEL_BLOCK = re.compile(r'\{((?:[^"}]|"(?:[^"\\]|\\.)*")*)\}')
"""`{...}` at a sample's name end, up to the brace that closes it: braces inside quoted values
(escaped quotes included) do not close it. Matched with the line's end as `endpos`."""
_LABEL_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')
_ESCAPE = re.compile(r"\\(.)")
_UNESCAPED = {"n": "\n", "\\": "\\", '"': '"'}


class Sample(NamedTuple):
    """One line of a series: its value and its label block as written."""

    value: float
    """May be NaN or infinite: the exposition's own value; `total` and `highest` skip NaN."""
    label_text: str
    """What stood between the braces, unparsed ("" without labels); `labels()` reads it (only
    info metrics carry data there, so the routine gauges never pay for it)."""

    def labels(self) -> dict[str, str]:
        """The label names and their unescaped values (a malformed pair is left out)."""
        return {
            match[1]: _ESCAPE.sub(lambda e: _UNESCAPED.get(e[1], e[0]), match[2])
            for match in _LABEL_PAIR.finditer(self.label_text)
        }


def read(text: str, names: Iterable[str]) -> dict[str, list[Sample]]:
    """The samples of each named series in `text`, in exposition order, one per label set.

    Every name asked for is a key of the result; a series the text lacks maps to `[]`. A name
    matches a sample line that starts with it and continues with `{` or a blank, so asking for
    `vllm:num_requests_waiting` does not pick up `vllm:num_requests_waiting_by_reason`.
    """
    body = "\n" + text  # every line, the first one too, starts after a newline
    found: dict[str, list[Sample]] = {}
    for name in names:
        samples = found[name] = []
        needle = "\n" + name
        hit = body.find(needle)
        while hit >= 0:
            sample = _sample_at(body, hit + len(needle))
            if sample is not None:
                samples.append(sample)
            hit = body.find(needle, hit + len(needle))
    return found


def _sample_at(text: str, start: int) -> Sample | None:
    """The sample whose line continues at `start`, just after its name; None if it is not one
    (a longer name, or a line that does not parse)."""
    end = text.find("\n", start)
    if end < 0:
        end = len(text)
    next_char = text[start : start + 1]
    if next_char == "{":
        block = _LABEL_BLOCK.match(text, start, end)
        if block is None:
            return None
        label_text, fields = block[1], text[block.end() : end].split()
    elif next_char in (" ", "\t"):
        label_text, fields = "", text[start:end].split()
    else:
        return None
    if not 1 <= len(fields) <= 2:
        return None
    try:
        value = float(fields[0])
        if len(fields) == 2:
            int(fields[1])  # a timestamp in milliseconds: checked, not kept
    except ValueError:
        return None
    return Sample(value, label_text)


def total(samples: Iterable[Sample]) -> float | None:
    """Sum over the label sets (NaN samples skipped); None when no sample is a number."""
    values = [sample.value for sample in samples if not math.isnan(sample.value)]
    return math.fsum(values) if values else None


def highest(samples: Iterable[Sample]) -> float | None:
    """Largest value over the label sets (NaN samples skipped); None when no sample is a number."""
    return max((sample.value for sample in samples if not math.isnan(sample.value)), default=None)


def requests_in_engine(text: str) -> int | None:
    """Running plus waiting requests summed over every engine and model behind the port (data
    parallel ranks and models each export their own label set), rounded to a whole count; None
    when the text has neither gauge as a number (not a vLLM engine, or not serving yet) or the
    sum is infinite (no count to wait for)."""
    found = read(text, (RUNNING, WAITING))
    running, waiting = total(found[RUNNING]), total(found[WAITING])
    if running is None and waiting is None:
        return None
    count = (running or 0.0) + (waiting or 0.0)
    return round(count) if math.isfinite(count) else None
