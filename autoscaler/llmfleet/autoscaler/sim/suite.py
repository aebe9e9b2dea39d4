"""`llmfleet sim --suite robust`: traffic the policy was not tuned on, made from the public traces
by documented transformations, each replayed with the same defaults as a plain `llmfleet sim`.

Per base trace (each is pure and deterministic: no random draws):
- `speed xK` (K = 0.5, 2, 4, 8): arrival times divided by K (x8: the same requests in an eighth
  of the time, eight times the rate);
- `prompts xK` (K = 0.5, 2): every prompt's length times K (at least 1 token); a prompt's prefix
  blocks follow its length (x2: each block becomes two, so shared prefixes stay shared; x0.5:
  the first half of its blocks);
- `idle -> busiest`: five idle minutes, then the trace from its busiest minute (the 60 s with the
  most prompt tokens) on, at most 15 minutes of it: a cold pool meets the peak at once;
- `step x4`: the middle third of the trace carries four times its requests (each request and
  three copies spread evenly over the gap to the next arrival; the copies keep the request's
  prefix blocks, as more users of the same application would);
- `ramp 1 h`: the trace repeated to an hour (each repeat with its own block ids) and thinned by
  a ramp: request i at time t is kept when frac(i x golden ratio) < t / 3600, so the rate climbs
  evenly from nothing to the trace's own over the hour;
- `light x0.1 over 2 h`: the trace repeated to two hours (as for the ramp) and thinned to a
  tenth of its requests, kept when frac(i x golden ratio) < 0.1: a service a replica or two
  serve, where a floor of two serving pods is most of the cost.
And once, over the first two base traces: `A + B`, both replayed from second 0 together (their
block ids kept apart), against the looser of their SLOs (a fleet serving both applications).

The SLO of a member is its base trace's default (`cli.SLO_DEFAULTS`); nothing else changes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from llmfleet.autoscaler.sim.traces import Request, Trace

_GOLDEN = (math.sqrt(5) - 1) / 2
_IDLE_S = 300.0
_BUSIEST_SPAN_S = 900.0
_RAMP_S = 3600.0
_LIGHT_SHARE = 0.1
_LIGHT_S = 7200.0
_BLOCK_OFFSET = 1 << 40
"""Added to block ids (times the repeat or trace number) so copies never share a prefix."""
SPEEDS = (0.5, 2.0, 4.0, 8.0)
PROMPT_FACTORS = (0.5, 2.0)


@dataclass(frozen=True)
class Member:
    name: str
    trace: Trace
    slo_kind: str
    """Which trace kind's default SLO applies (`cli.SLO_DEFAULTS`)."""


def _trace(base: Trace, label: str, requests: list[Request], kind: str | None = None) -> Trace:
    ordered = tuple(sorted(requests, key=lambda r: r.arrival))
    return Trace(f"{base.name} {label}", kind or base.kind, ordered, base.block_tokens)


def speed(trace: Trace, factor: float) -> Trace:
    requests = [replace(r, arrival=r.arrival / factor) for r in trace.requests]
    return _trace(trace, f"speed x{factor:g}", requests)


def prompts(trace: Trace, factor: float) -> Trace:
    def scaled(r: Request) -> Request:
        blocks = r.blocks
        if factor >= 2:
            copies = int(factor)
            blocks = tuple(b * copies + k for b in r.blocks for k in range(copies))
        elif factor < 1:
            blocks = r.blocks[: math.ceil(len(r.blocks) * factor)]
        return replace(r, prompt_tokens=max(1, round(r.prompt_tokens * factor)), blocks=blocks)

    return _trace(trace, f"prompts x{factor:g}", [scaled(r) for r in trace.requests])


def idle_then_busiest(trace: Trace) -> Trace:
    best_start, best_tokens, hi, tokens = 0.0, -1, 0, 0
    requests = trace.requests
    for first in requests:
        while hi < len(requests) and requests[hi].arrival < first.arrival + 60.0:
            tokens += requests[hi].prompt_tokens
            hi += 1
        if tokens > best_tokens:
            best_start, best_tokens = first.arrival, tokens
        tokens -= first.prompt_tokens
    kept = [
        replace(r, arrival=r.arrival - best_start + _IDLE_S)
        for r in requests
        if best_start <= r.arrival < best_start + _BUSIEST_SPAN_S
    ]
    return _trace(trace, "idle -> busiest", kept)


def step(trace: Trace, factor: int = 4) -> Trace:
    third = trace.duration / 3
    requests = list(trace.requests)
    result: list[Request] = []
    for i, r in enumerate(requests):
        result.append(r)
        if third <= r.arrival < 2 * third:
            following = requests[i + 1].arrival if i + 1 < len(requests) else r.arrival + 1.0
            gap = max(following - r.arrival, 0.0)
            result.extend(
                replace(r, arrival=r.arrival + gap * k / factor) for k in range(1, factor)
            )
    return _trace(trace, f"step x{factor} in the middle", result)


def _repeated(trace: Trace, span_s: float) -> list[Request]:
    """The trace over and over until `span_s`, each repeat with its own block ids."""
    period = max(trace.duration, 1.0)
    result: list[Request] = []
    repeat = 0
    while repeat * period < span_s:
        offset = repeat * period
        for r in trace.requests:
            t = r.arrival + offset
            if t >= span_s:
                break
            result.append(
                replace(r, arrival=t, blocks=tuple(b + repeat * _BLOCK_OFFSET for b in r.blocks))
            )
        repeat += 1
    return result


def ramp(trace: Trace, span_s: float = _RAMP_S) -> Trace:
    result = _repeated(trace, span_s)
    kept = [r for i, r in enumerate(result) if (i * _GOLDEN) % 1.0 < r.arrival / span_s]
    return _trace(trace, "ramp over 1 h", kept)


def light(trace: Trace, share: float = _LIGHT_SHARE, span_s: float = _LIGHT_S) -> Trace:
    result = _repeated(trace, span_s)
    kept = [r for i, r in enumerate(result) if (i * _GOLDEN) % 1.0 < share]
    return _trace(trace, f"light x{share:g} over {span_s / 3600:g} h", kept)


def superimpose(a: Trace, b: Trace, kind: str) -> Trace:
    shifted = [replace(r, blocks=tuple(x + _BLOCK_OFFSET for x in r.blocks)) for r in b.requests]
    merged = sorted([*a.requests, *shifted], key=lambda r: r.arrival)
    return Trace(f"{a.name} + {b.name}", kind, tuple(merged), a.block_tokens)


def members(bases: list[Trace], looser: Callable[[str, str], str]) -> list[Member]:
    """Every member for `bases`, in the order the suite prints them; `looser(kind_a, kind_b)`
    names the kind whose SLO is the looser of the two."""
    result: list[Member] = []
    for base in bases:
        made = [speed(base, k) for k in SPEEDS]
        made += [prompts(base, k) for k in PROMPT_FACTORS]
        made += [idle_then_busiest(base), step(base), ramp(base), light(base)]
        result += [Member(t.name, t, base.kind) for t in made]
    if len(bases) >= 2:
        a, b = bases[0], bases[1]
        kind = looser(a.kind, b.kind)
        both = superimpose(a, b, kind)
        result.append(Member(both.name, both, kind))
    return result
