"""Bench-only: where a gateway's event loop stalls, one record per stall (issue 28).

`LoopLag` (the gateway's own sampler) ticks every 50 ms, so it says how long the loop was held
at most, not what held it. Run a gateway through this module instead of `llmfleet.core.cli`
(`python bench/_stall_probe.py OUT -- gateway ...`) and, once the gateway's `LoopLag` starts on
its loop, a callback runs on that loop every `TICK` seconds and stamps the time, while a thread
of its own watches the stamp. When the stamp is older than `THRESHOLD`, the loop is stalled:
the watcher then takes, every tick until the loop runs again,
- the Python stack of every thread (`sys._current_frames`: where the loop thread is, and what
  the others run meanwhile);
- from Linux's per-thread `schedstat`, the CPU time each thread of the process ran and the time
  it waited on a run queue (for a CPU) from the last tick before the stall until the watcher
  saw it end (`window_ms`, longer than the stall when the watcher too waited for the GIL).
A loop thread that neither ran nor waited for a CPU through a stall was waiting for the GIL.
A thread that ran during the stall while the loop thread did not is the one that held the GIL;
a thread that waited for a CPU meanwhile may have been descheduled holding it.

Each stall of at least `RECORD` seconds is appended to OUT as one JSON line: its wall time, its
length, per thread (by Python name) ran/waited milliseconds, and the stacks seen with how many
ticks each. The probe costs CPU (a callback and a wake-up a millisecond): measure with it to
find causes, not to quote figures. Made for diagnosis; not part of the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import runpy
import sys
import threading
import time
import traceback
from collections import Counter
from typing import Any

from llmfleet.gateway import loop_lag

TICK = 0.001
THRESHOLD = 0.003
"""A stamp older than this is a stall (three ticks missed)."""
RECORD = 0.005
"""Stalls at least this long are written (the issue's lag goal)."""
FRAMES = 10
"""Innermost frames kept per stack."""


class _Tasks:
    """The process's threads as Linux sees them, read through files kept open (a pread each)."""

    def __init__(self) -> None:
        self._files: dict[int, tuple[int, int]] = {}
        self.refresh()

    def refresh(self) -> None:
        """Open the files of threads started since; close those of threads gone."""
        now = {int(entry) for entry in os.listdir("/proc/self/task")}
        for tid in set(self._files) - now:
            for fd in self._files.pop(tid):
                os.close(fd)
        for tid in now - set(self._files):
            with contextlib.suppress(OSError):  # gone meanwhile
                self._files[tid] = (
                    os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY),
                    os.open(f"/proc/self/task/{tid}/stat", os.O_RDONLY),
                )

    def schedstat(self) -> dict[int, tuple[int, int]]:
        """tid -> (ns on a CPU, ns waiting on a run queue) so far."""
        found = {}
        for tid, (fd, _) in self._files.items():
            try:
                fields = os.pread(fd, 128, 0).split()
                found[tid] = (int(fields[0]), int(fields[1]))
            except (OSError, IndexError, ValueError):
                pass
        return found

    def runnable(self) -> set[int]:
        """Threads running or waiting for a CPU now (state R)."""
        found = set()
        for tid, (_, fd) in self._files.items():
            try:
                if os.pread(fd, 512, 0).rsplit(b")", 1)[1].split()[0] == b"R":
                    found.add(tid)
            except (OSError, IndexError):
                pass
        return found


def _names() -> dict[int, str]:
    """Native thread id -> Python thread name (the loop thread's is `MainThread`)."""
    return {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}


def _stack(frame: Any) -> str:
    summary = traceback.extract_stack(frame)[-FRAMES:]
    return " <- ".join(
        f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in reversed(summary)
    )


class Probe:
    def __init__(self, out: str) -> None:
        self.out = out
        self.stamp = time.perf_counter()
        self.started = False
        self.loop_thread: int | None = None

    def on_loop(self, loop: Any) -> None:
        """Called on the loop's thread once it runs: start stamping and watching."""
        if self.started:
            return
        self.started = True
        self.loop_thread = threading.get_ident()

        def stamp() -> None:
            self.stamp = time.perf_counter()
            loop.call_later(TICK, stamp)

        stamp()
        threading.Thread(target=self._watch, name="stall-probe", daemon=True).start()

    def _watch(self) -> None:
        me = threading.get_ident()
        tasks = _Tasks()
        before, before_at = tasks.schedstat(), time.perf_counter()
        stall: dict[str, Any] | None = None
        ticks = 0
        while True:
            time.sleep(TICK)
            late = time.perf_counter() - self.stamp
            if late > THRESHOLD:
                if stall is None:
                    stall = {"from": self.stamp, "wall": time.time() - late, "before": before,
                             "before_at": before_at, "stacks": Counter()}  # fmt: skip
                # The loop thread's stack always; another's only while it runs or waits for
                # a CPU (threads asleep in a socket read are not what holds the loop).
                runnable = tasks.runnable()
                threads = {t.ident: t for t in threading.enumerate()}
                for ident, frame in sys._current_frames().items():
                    thread = threads.get(ident)
                    if ident == me or thread is None:
                        continue
                    if ident == self.loop_thread or thread.native_id in runnable:
                        name = "LOOP" if ident == self.loop_thread else thread.name
                        stall["stacks"][f"{name}: {_stack(frame)}"] += 1
                continue
            if stall is not None:
                self._write(stall, self.stamp - stall["from"] - TICK, tasks.schedstat())
                stall = None
            ticks += 1
            if ticks % 500 == 0:
                tasks.refresh()
            before, before_at = tasks.schedstat(), time.perf_counter()

    def _write(self, stall: dict[str, Any], seconds: float,
               after: dict[int, tuple[int, int]]) -> None:  # fmt: skip
        if seconds < RECORD:
            return
        names = _names()
        threads = {}
        for tid, (ran, waited) in after.items():
            ran0, waited0 = stall["before"].get(tid, (ran, waited))
            if ran - ran0 or waited - waited0:
                threads[names.get(tid, str(tid))] = {
                    "ran_ms": round((ran - ran0) / 1e6, 2),
                    "waited_ms": round((waited - waited0) / 1e6, 2),
                }
        # The times are over a window from before the stall to when this thread saw it end,
        # which can be later than the end when the GIL kept it waiting too.
        window = time.perf_counter() - stall["before_at"]
        record = {"wall": round(stall["wall"], 3), "ms": round(seconds * 1000, 1),
                  "window_ms": round(window * 1000, 1), "threads": threads,
                  "stacks": stall["stacks"].most_common(12)}  # fmt: skip
        with open(self.out, "a") as file:
            file.write(json.dumps(record) + "\n")


def install(out: str) -> Probe:
    """Hook the probe onto the gateway's `LoopLag.start` (run on its loop)."""
    probe = Probe(out)
    start = loop_lag.LoopLag.start

    def started(self: Any) -> None:
        start(self)
        probe.on_loop(asyncio.get_running_loop())

    loop_lag.LoopLag.start = started  # type: ignore[method-assign]
    return probe


def read(path: str) -> list[dict[str, Any]]:
    """The stalls a probe wrote (none if it wrote nothing)."""
    try:
        with open(path) as file:
            return [json.loads(line) for line in file if line.strip()]
    except FileNotFoundError:
        return []


def summary(stalls: list[dict[str, Any]], since: float, until: float, top: int = 3) -> list[str]:
    """Lines on the stalls in [since, until]: how many, and the `top` longest with the threads
    that ran or waited most meanwhile and the stack seen most often on each."""
    inside = sorted((s for s in stalls if since <= s["wall"] <= until), key=lambda s: -s["ms"])
    lines = [f"{len(inside)} stalls >= {RECORD * 1000:.0f} ms"
             + (f", longest {inside[0]['ms']} ms" if inside else "")]  # fmt: skip
    for stall in inside[:top]:
        busy = sorted(stall["threads"].items(),
                      key=lambda kv: -kv[1]["ran_ms"] - kv[1]["waited_ms"])  # fmt: skip
        lines.append(
            f"  {stall['ms']} ms (times over {stall.get('window_ms', '?')} ms): "
            + "; ".join(f"{name} ran {t['ran_ms']} waited {t['waited_ms']}" for name, t in busy[:4])
        )
        for stack, ticks in stall["stacks"][:4]:
            lines.append(f"    {ticks}x {stack[:300]}")
    return lines


if __name__ == "__main__":
    # python _stall_probe.py OUT -- <llmfleet CLI arguments>
    out, rest = sys.argv[1], sys.argv[sys.argv.index("--") + 1 :]
    install(out)
    sys.argv = ["llmfleet", *rest]
    runpy.run_module("llmfleet.core.cli", run_name="__main__")
