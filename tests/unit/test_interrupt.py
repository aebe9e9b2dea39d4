"""A pytest run sent SIGTERM runs its fixtures' teardown (tests/interrupt.py), as the e2e
suite's `llmfleet up --detach` system and the cluster fixtures rely on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

CONFTEST = """
from tests.interrupt import stop_on_sigterm

def pytest_configure(config):
    if {install}:
        stop_on_sigterm()
"""

TEST = """
import time
from pathlib import Path

import pytest

HERE = Path(__file__).parent

@pytest.fixture(scope="session")
def system():
    yield
    (HERE / "torn-down").write_text("yes")

def test_long(system):
    (HERE / "started").write_text("yes")
    time.sleep(60)
"""


def wait_for_file(path: Path, process: subprocess.Popen[str], deadline_s: float) -> None:
    deadline = time.monotonic() + deadline_s
    while not path.exists():
        if process.poll() is not None:
            raise AssertionError(f"pytest ended ({process.returncode}) before {path.name}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {path.name} within {deadline_s:.0f}s")
        time.sleep(0.05)


@pytest.mark.parametrize(("install", "torn_down"), [(True, True), (False, False)])
def test_sigterm_runs_the_session_teardown(tmp_path: Path, install: bool, torn_down: bool) -> None:
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CONFTEST.format(install=install)))
    (tmp_path / "test_it.py").write_text(textwrap.dedent(TEST))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    process = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for_file(tmp_path / "started", process, deadline_s=60)
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    finally:
        process.kill()
    assert (tmp_path / "torn-down").exists() == torn_down, output
    if torn_down:
        assert "KeyboardInterrupt" in output, output
        assert "signal SIGTERM" in output, output
    else:
        assert process.returncode == -signal.SIGTERM, output
