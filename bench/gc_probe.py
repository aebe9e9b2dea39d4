"""Run `llmfleet ARGS...` with every garbage collection timed, written to a JSON file on SIGUSR1.

    python bench/gc_probe.py --out pauses.json [--path ROOT ...] -- gateway --static-config ...

The process is the `llmfleet` console script's (same imports, same start-up heap), plus one
`gc.callbacks` entry that records each collection as `[start, generation, seconds]` (start on
`time.monotonic()`, the clock the benchmark stamps its phases with, shared by all processes
on Linux). SIGUSR1 writes every collection so far to `--out` (atomically), and so does a normal
exit; not SIGTERM, after which uvicorn re-raises the signal and no exit handler runs.
`--path` puts a checkout's package roots ahead of the installed ones (`--baseline`).
A callback costs about a microsecond per collection; the gateway's own
`llmfleet_gateway_gc_pause_seconds`, where it exists, measures the same pauses.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import json
import signal
import sys
import time
from pathlib import Path


def record_collections(out: Path) -> None:
    """Time every collection from now on; write them to `out` on SIGUSR1 and at exit."""
    pauses: list[tuple[float, int, float]] = []
    started: list[float] = [0.0]

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.monotonic()
        else:
            pauses.append((started[0], info["generation"], time.monotonic() - started[0]))

    def write(*_: object) -> None:
        partial = out.with_suffix(".partial")
        partial.write_text(json.dumps(pauses))
        partial.replace(out)

    gc.callbacks.append(callback)
    signal.signal(signal.SIGUSR1, write)
    atexit.register(write)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--path", action="append", default=[], help="put ahead on sys.path")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="-- then llmfleet's arguments")
    args = parser.parse_args()
    sys.path[:0] = args.path
    record_collections(args.out)
    sys.argv = ["llmfleet", *(args.args[1:] if args.args[:1] == ["--"] else args.args)]
    from llmfleet.core.cli import main as llmfleet  # noqa: PLC0415 (after sys.path is set)

    llmfleet()


if __name__ == "__main__":
    main()
