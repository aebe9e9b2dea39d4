"""The end-to-end suite: the whole system as `llmfleet up` starts it, driven from outside.

One system per session (`llmfleet up --detach` with its state in a temporary folder and free
ports), reached only as a user reaches it: the gateway and Prometheus through the relayed ports
on 127.0.0.1, the cluster through its kubeconfig. Like every test here it runs inside the test
run's loopback-only namespace (`make test`); the system makes its own namespace inside that one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.system import LocalSystem
from tests.interrupt import stop_on_sigterm
from tests.net import free_port, require_isolation
from tests.session_exit import SessionExit


def pytest_configure(config: pytest.Config) -> None:
    stop_on_sigterm()  # a killed run still stops its `llmfleet up --detach` system
    config.pluginmanager.register(SessionExit(), "llmfleet-session-exit")  # no abort at exit


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # `llmfleet down` leaves nothing: checked last, after every other test used the system.
    items.sort(key=lambda item: item.get_closest_marker("last") is not None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Iterator[pytest.TestReport]:
    """A failed test's report (or a failed fixture's) carries the system's state and logs at
    the moment it failed (CI keeps only what pytest prints, and the system is gone after the
    run)."""
    report: pytest.TestReport = yield
    if report.when in ("setup", "call") and report.failed:
        for value in getattr(item, "funcargs", {}).values():
            if isinstance(value, LocalSystem):
                report.sections.append(("the system when the test failed", value.diagnose()))
    return report


def start_system(state: Path, *extra: str) -> LocalSystem:
    """`llmfleet up --detach` (with `extra` options) with its state in `state` and free ports;
    returns once both sample models answer through the gateway."""
    require_isolation()
    env = {**os.environ, "LLMFLEET_STATE_DIR": str(state)}
    ports = {"gateway": free_port(), "prometheus": free_port()}
    command = [
        sys.executable, "-m", "llmfleet.core.cli", "up", "--detach", *extra,
        "--gateway-port", str(ports["gateway"]), "--prometheus-port", str(ports["prometheus"]),
    ]  # fmt: skip
    started = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    print(started.stderr, file=sys.stderr)
    local = LocalSystem(Path(state), env, ports["gateway"], ports["prometheus"])
    local.up_output = started.stdout
    if started.returncode != 0:
        local.down()
        pytest.fail(f"llmfleet up failed ({started.returncode}): {started.stderr[-2000:]}")
    try:
        local.wait_models(["qwen-7b", "llama-8b-pd"])
    except BaseException:
        local.down()
        raise
    return local


def running_system(
    tmp_path_factory: pytest.TempPathFactory, name: str, *extra: str
) -> Iterator[LocalSystem]:
    """A fixture's body: a system of its own (`start_system` with `extra`), stopped after."""
    local = start_system(tmp_path_factory.mktemp(name), *extra)
    try:
        yield local
    finally:
        local.down()


@pytest.fixture(scope="session")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSystem]:
    """The system as `make up` starts it: the chart's pods and the samples' engine pods on a real
    node, from the built images."""
    yield from running_system(tmp_path_factory, "state", "--real-node")
