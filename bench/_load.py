"""The load bench/gateway_overhead.py sends: open-loop Poisson arrivals (plain or streamed
answers), one long prompt at a time, and a closed loop through oha.

Open loop: arrivals are drawn from a seeded exponential distribution (the same schedule for every
target of a round) and sent whatever the earlier requests are doing; a latency runs from the
arrival's scheduled time to the answer's last byte, so a client or server that falls behind
shows it. The first `LEAD_IN` seconds warm connections and are not counted. An arrival finding
`max_in_flight` requests outstanding is dropped, not delayed (delaying would close the loop), and
counted; whatever is still out `DRAIN` seconds after the last arrival is cancelled and counted as
an error, so an overloaded target ends its phase in bounded time.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

LEAD_IN = 1.0
DRAIN = 15.0


@dataclass
class Request:
    """What one request looks like on the wire, for one target."""

    url: str
    body: bytes
    headers: dict[str, str]


@dataclass
class OpenLoop:
    """One open-loop phase against one target (seconds)."""

    latencies: list[float] = field(default_factory=list)
    first_bytes: list[float] = field(default_factory=list)
    """Streams only: scheduled arrival to the first SSE event."""
    sent: int = 0
    """Arrivals sent, lead-in included (the denominator of CPU per request)."""
    errors: int = 0
    """Non-200 answers, failed or cancelled requests, after the lead-in."""
    dropped: int = 0
    """Arrivals not sent: `max_in_flight` requests were outstanding."""
    counted: int = 0
    """Arrivals after the lead-in (sent or dropped)."""


def arrivals(rate: float, seconds: float, seed: int) -> list[float]:
    """Poisson arrival times in [0, LEAD_IN + seconds), the same for the same arguments."""
    rng = random.Random(seed)
    times: list[float] = []
    at = rng.expovariate(rate)
    while at < LEAD_IN + seconds:
        times.append(at)
        at += rng.expovariate(rate)
    return times


async def open_loop(
    request: Request | Sequence[Request],
    schedule: list[float],
    stream: bool,
    max_in_flight: int = 1024,
    timeout: float = 30,
) -> OpenLoop:
    """`request` may be one, or one per arrival of `schedule` (in its order)."""
    result = OpenLoop()
    requests = [request] if isinstance(request, Request) else request
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None)
    limits = aiohttp.ClientTimeout(total=timeout)
    in_flight: set[asyncio.Task[None]] = set()
    async with aiohttp.ClientSession(connector=connector, timeout=limits) as session:

        async def one(request: Request, due: float, counted: bool) -> None:
            try:
                async with session.post(
                    request.url, data=request.body, headers=request.headers
                ) as response:
                    if stream:
                        first = await _first_event(response)
                        if counted and first:
                            result.first_bytes.append(time.perf_counter() - due)
                    async for _ in response.content.iter_any():
                        pass
                    ok = response.status == 200
            except (aiohttp.ClientError, TimeoutError):
                ok = False
            if counted:
                if ok:
                    result.latencies.append(time.perf_counter() - due)
                else:
                    result.errors += 1

        begin = time.perf_counter()
        for index, at in enumerate(schedule):
            due = begin + at
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            counted = at >= LEAD_IN
            result.counted += counted
            if len(in_flight) >= max_in_flight:
                result.dropped += counted
                continue
            task = asyncio.create_task(one(requests[index % len(requests)], due, counted))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
            result.sent += 1
        if in_flight:
            _done, late = await asyncio.wait(set(in_flight), timeout=DRAIN)
            for task in late:
                task.cancel()
            result.errors += len(late)
            await asyncio.gather(*late, return_exceptions=True)
    return result


async def _first_event(response: aiohttp.ClientResponse) -> bool:
    """Read until the first SSE `data:` line has arrived; False when the body ended first."""
    seen = b""
    while b"data:" not in seen:
        chunk = await response.content.readany()
        if not chunk:
            return False
        seen = seen[-8:] + chunk
    return True


async def sequential(
    request: Request, repeats: int, warm: int = 2, timeout: float = 60
) -> tuple[list[float], int]:
    """`repeats` requests one after the other (after `warm` uncounted): latencies and errors."""
    latencies: list[float] = []
    errors = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
        for i in range(warm + repeats):
            start = time.perf_counter()
            try:
                async with session.post(
                    request.url, data=request.body, headers=request.headers
                ) as response:
                    await response.read()
                    ok = response.status == 200
            except (aiohttp.ClientError, TimeoutError):
                ok = False
            if i >= warm:
                if ok:
                    latencies.append(time.perf_counter() - start)
                else:
                    errors += 1
    return latencies, errors


@dataclass
class ClosedLoop:
    requests_per_second: float
    """Answers with status 200 per second of the run."""
    ok: int
    failed: int
    p50: float
    p99: float


def closed_loop(
    oha: Path, request: Request, connections: int, seconds: float, pin: list[str]
) -> ClosedLoop:
    """oha with `connections` keep-alive connections for `seconds` (one worker thread, run
    under the `pin` prefix, e.g. taskset)."""
    command = [*pin, str(oha), "--no-tui", "--output-format", "json", "--worker-threads", "1"]
    command += [
        "-z",
        f"{seconds}s",
        "-c",
        str(connections),
        "-m",
        "POST",
        "-d",
        request.body.decode(),
    ]
    command += [f"-H{name}: {value}" for name, value in request.headers.items()]
    command.append(request.url)
    done = subprocess.run(command, capture_output=True, check=False, timeout=seconds + 60)
    if done.returncode != 0:
        raise RuntimeError(f"oha failed: {done.stderr.decode(errors='replace')[-500:]}")
    report = json.loads(done.stdout)
    statuses = {str(code): count for code, count in report["statusCodeDistribution"].items()}
    ok = statuses.get("200", 0)
    # oha cuts the requests still out at its deadline: not failures of the target.
    errors = report.get("errorDistribution", {})
    cut = sum(count for error, count in errors.items() if "deadline" in error)
    failed = sum(statuses.values()) - ok + sum(errors.values()) - cut
    percentiles = report["latencyPercentiles"]
    return ClosedLoop(
        requests_per_second=ok / report["summary"]["total"],
        ok=ok,
        failed=failed,
        p50=percentiles["p50"] or 0.0,
        p99=percentiles["p99"] or 0.0,
    )
