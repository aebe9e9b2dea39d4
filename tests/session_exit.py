"""A test run ends with pytest's status once its results are out, skipping Python's finalization.

Tests start servers, informers and watches in daemon threads of the pytest process. Python's
finalization runs while such threads still live, and a daemon thread caught holding a lock that
finalization needs (the one of `sys.stderr`'s buffer is the known case) aborts the process with
SIGABRT. A run whose every test passed then reads as failed: CI saw "4056 passed", then make's
"Aborted". The threads still alive are named on stderr (what to fix: a test that leaves one), and
the process ends at once with the status pytest decided.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading

import pytest

_status: list[int] = []


def record_status(exitstatus: int) -> None:
    """Keep the session's status (call from `pytest_sessionfinish`, trylast)."""
    _status[:] = [int(exitstatus)]


def exit_now() -> None:
    """Name the threads left alive, then end the process with the kept status (call from
    `pytest_unconfigure`, trylast: every plugin has written its files and its report)."""
    if not _status:
        return  # no session ran (`--help`, a collection error before it): exit as pytest does
    left = [t for t in threading.enumerate() if t is not threading.main_thread() and t.is_alive()]
    if left:
        names = ", ".join(sorted(t.name for t in left))
        # Straight to the descriptor: a thread left running may hold sys.stderr's lock.
        os.write(2, f"test run: {len(left)} thread(s) left running at the end: {names}\n".encode())
    flushing = threading.Thread(target=_flush, name="flush-at-exit", daemon=True)
    flushing.start()
    flushing.join(FLUSH_SECONDS)  # the same wait finalization would give a held lock
    os._exit(_status[0])


FLUSH_SECONDS = 1.0


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or broken: nothing to keep
            stream.flush()


class SessionExit:
    """The two hooks, as a plugin a conftest registers (`config.pluginmanager.register`)."""

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        record_status(exitstatus)

    @pytest.hookimpl(trylast=True)
    def pytest_unconfigure(self, config: pytest.Config) -> None:
        exit_now()
