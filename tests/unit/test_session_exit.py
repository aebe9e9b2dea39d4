"""A pytest run whose daemon thread holds stderr's lock at the end still exits with pytest's
status (tests/session_exit.py); without the plugin Python's finalization aborts it (SIGABRT), as
CI once saw after every test had passed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

CONFTEST = """
from tests.session_exit import SessionExit

def pytest_configure(config):
    if {install}:
        config.pluginmanager.register(SessionExit(), "session-exit")
"""

# The thread writes to a stderr whose raw write never returns: it holds the buffer's lock, as a
# daemon thread blocked on a pipe would. Started by the test ("now"), it holds the lock through
# the end of the session; left to the launcher's atexit hook ("at_exit"), registered before
# logging's own (which would flush stderr first and wait), it takes the lock just before
# finalization flushes stderr: what finalization cannot survive, as in CI.
TEST = """
import io
import sys
import threading
import time


class Stuck(io.RawIOBase):
    def writable(self):
        return True

    def write(self, data):
        time.sleep(3600)
        return len(data)


def hold_stderr():
    stuck = io.TextIOWrapper(io.BufferedWriter(Stuck(), buffer_size=16), write_through=True)
    writing = threading.Event()

    def writer():
        writing.set()
        stuck.write("never written " * 8)  # past the 16-byte buffer: into Stuck.write

    sys.stderr = stuck
    threading.Thread(target=writer, name="stuck-writer", daemon=True).start()
    assert writing.wait(5)
    time.sleep(0.2)  # into Stuck.write, the lock held


def test_leaves_a_thread():
    if "{when}" == "now":
        hold_stderr()
    else:
        sys.modules["__main__"].hold = hold_stderr  # the launcher calls it at exit


def test_outcome():
    assert {passes}
"""


LAUNCHER = """
import atexit
import sys


def at_exit():
    if "hold" in globals():
        hold()


atexit.register(at_exit)  # before pytest imports logging: called after logging's
import pytest

sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-s", sys.argv[1]]))
"""


def run(
    tmp_path: Path, install: bool, when: str, passes: bool = True
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CONFTEST.format(install=install)))
    (tmp_path / "test_it.py").write_text(textwrap.dedent(TEST.format(when=when, passes=passes)))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    return subprocess.run(
        [sys.executable, "-c", LAUNCHER, str(tmp_path)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(("passes", "status"), [(True, 0), (False, 1)])
def test_a_thread_holding_stderr_is_named_and_the_status_kept(
    tmp_path: Path, passes: bool, status: int
) -> None:
    done = run(tmp_path, install=True, when="now", passes=passes)
    said = done.stdout + done.stderr
    assert done.returncode == status, said
    assert "thread(s) left running at the end: stuck-writer" in done.stderr, said


@pytest.mark.parametrize(("install", "status"), [(True, 0), (False, -signal.SIGABRT)])
def test_a_lock_taken_at_finalization_aborts_only_without_it(
    tmp_path: Path, install: bool, status: int
) -> None:
    """The failure CI saw, reproduced: every test passed, then SIGABRT at finalization."""
    done = run(tmp_path, install=install, when="at_exit")
    said = done.stdout + done.stderr
    assert "2 passed" in done.stdout, said
    assert done.returncode == status, said
    aborted = "at interpreter shutdown, possibly due to daemon threads" in done.stderr
    assert aborted == (not install), said
