"""`--profile DIR`: py-spy on a running gateway, a flame graph and the top functions as text.

py-spy (from `make bench-peers`) samples the process `RATE` times a second, aggregating by
function (`--function`), idle threads left out: two consecutive recordings of `seconds` each
under the same load, the first as collapsed stacks with full file names (`NAME.collapsed`,
summarised into `NAME-top.txt`: the functions with the most samples on top of the stack and in
the stack, and the share of samples by package), the second as `NAME.svg`. Samples whose top
frame is `Runner.run` (asyncio/runners.py) are time in the event loop's own C code (uvloop:
polling, socket reads and writes), shown as the package "event loop (uvloop C code)".
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from pathlib import Path

RATE = 200
_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


async def record(
    py_spy: Path, pid: int, out: Path, name: str, *, seconds: float, pin: list[str]
) -> list[Path]:
    """Record `pid` twice (collapsed stacks, then the flame graph); the files written."""
    written = []
    runs = (
        (out / f"{name}.collapsed", ["--format", "raw", "--full-filenames"]),
        (out / f"{name}.svg", ["--format", "flamegraph"]),
    )
    for output, options in runs:
        command = [
            *pin,
            str(py_spy),
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(max(1, round(seconds))),
        ]
        command += ["--rate", str(RATE), "--function", *options, "--output", str(output)]
        process = await asyncio.create_subprocess_exec(
            *command, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
        )
        _, stderr = await process.communicate()
        if process.returncode != 0:
            raise RuntimeError(f"py-spy failed: {stderr.decode(errors='replace')[-500:]}")
        written.append(output)
    top = out / f"{name}-top.txt"
    top.write_text(summary(written[0].read_text(), name))
    return [*written, top]


def short(file: str) -> str:
    """A frame's file from its package on: `llmfleet/gateway/app.py`, `aiohttp/client.py`,
    `asyncio/tasks.py`."""
    if "/llmfleet/" in file:
        return "llmfleet/" + file.rsplit("/llmfleet/", 1)[1]
    if "site-packages/" in file:
        return file.rsplit("site-packages/", 1)[1]
    stdlib = re.search(r"/python3\.\d+/(.*)$", file)
    return stdlib[1] if stdlib else file.rsplit("/", 1)[-1]


def package(function: str, file: str) -> str:
    """Who a sample's top frame belongs to: `llmfleet`, a site-packages distribution's
    top-level name, a standard library module (`stdlib asyncio`), or the event loop's C code."""
    path = short(file)
    if function == "Runner.run" and path == "asyncio/runners.py":
        return "event loop (uvloop C code)"
    top = path.split("/", 1)[0].removesuffix(".py")
    if "site-packages/" in file or top == "llmfleet":
        return top
    return f"stdlib {top}" if re.search(r"/python3\.\d+/", file) else top


def _display(frame: str) -> str:
    match = _FRAME.match(frame)
    if not match:
        return frame
    line = f":{match['line']}" if match["line"] else ""
    return f"{match['function']} ({short(match['file'])}{line})"


def summary(collapsed: str, name: str, top: int = 20) -> str:
    """Top functions by self and total samples, and self samples by package."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    by_package: Counter[str] = Counter()
    samples = 0
    for line in collapsed.splitlines():
        stack, _, number = line.rpartition(" ")
        if not stack or not number.isdigit():
            continue
        frames = stack.split(";")
        count = int(number)
        samples += count
        leaf = frames[-1]
        own[_display(leaf)] += count
        match = _FRAME.match(leaf)
        by_package[package(match["function"], match["file"]) if match else "(unknown)"] += count
        for frame in {_display(frame) for frame in frames}:
            total[frame] += count
    if not samples:
        return f"{name}: no samples\n"

    def share(n: int) -> str:
        return f"{n / samples * 100:5.1f}%"

    lines = [f"{name}: {samples} samples ({RATE} Hz, idle left out)", "", "self (top of stack):"]
    lines += [f"  {share(n)}  {frame}" for frame, n in own.most_common(top)]
    # Frames in every sample (the start-up chain down to the event loop) say nothing.
    lines += ["", "total (anywhere in the stack; frames in every sample left out):"]
    below = [(frame, n) for frame, n in total.most_common() if n < samples]
    lines += [f"  {share(n)}  {frame}" for frame, n in below[:top]]
    lines += ["", "self samples by package:"]
    lines += [f"  {share(n)}  {pkg}" for pkg, n in by_package.most_common()]
    return "\n".join(lines) + "\n"
