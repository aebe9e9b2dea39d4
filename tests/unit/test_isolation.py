"""The test run itself is isolated: `make test` runs pytest through `llmfleet isolated`, in a
network namespace with only loopback, so no test can send a packet off the machine whatever the
code under test does (issue 11)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from llmfleet.core import loopback, netns
from tests.net import require_isolation

ROOT = Path(__file__).resolve().parents[2]


def test_the_test_process_sees_no_interface_but_loopback() -> None:
    assert netns.interfaces() == ["lo"], netns.isolation_problem()
    assert netns.isolation_problem() is None


@pytest.mark.parametrize("address", ["10.0.0.5", "10.255.1.1", "8.8.8.8", "192.168.1.1"])
def test_a_connection_off_loopback_fails_at_once(address: str) -> None:
    require_isolation()  # outside the namespace this connect would leave the machine
    with socket.socket() as sock:
        sock.settimeout(2)
        with pytest.raises(OSError, match=r"route|unreachable") as failed:
            sock.connect((address, 80))
    assert failed.value.errno in {errno.EHOSTUNREACH, errno.ENETUNREACH}, failed.value


def test_ipv6_off_loopback_is_unreachable() -> None:
    require_isolation()
    with (
        socket.socket(socket.AF_INET6) as sock,
        pytest.raises(OSError, match="unreachable") as failed,
    ):
        sock.connect(("2001:db8::1", 80))
    assert failed.value.errno == errno.ENETUNREACH


def test_loopback_and_the_advertise_address_still_work() -> None:
    with socket.socket() as server:
        server.bind((netns.ADVERTISE_ADDRESS, 0))
        server.listen()
        with socket.create_connection(server.getsockname(), timeout=2):
            pass


def test_the_run_has_loopback_only_on() -> None:
    assert loopback.enabled(), f"{loopback.ENV} should be set by `llmfleet isolated`"


PROBE = """
import json, socket, os
with socket.socket() as s:
    s.settimeout(2)
    try:
        s.connect(("10.0.0.9", 80)); outcome = "connected"
    except OSError as e:
        outcome = e.errno
print(json.dumps({"ifs": [n for _, n in socket.if_nameindex()], "connect": outcome,
                  "loopback_only": os.environ.get("LLMFLEET_LOOPBACK_ONLY")}))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="`unshare --net` needs root here")
def test_isolated_runs_a_command_in_a_fresh_namespace() -> None:
    """`llmfleet isolated` nests too: a fresh namespace with lo, its routes and the setting."""
    llmfleet = shutil.which("llmfleet") or os.path.join(os.path.dirname(sys.executable), "llmfleet")
    done = subprocess.run(
        [llmfleet, "isolated", "--", sys.executable, "-c", PROBE],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen == {"ifs": ["lo"], "connect": errno.EHOSTUNREACH, "loopback_only": "true"}
    assert "new network namespace with only loopback" in done.stderr


def test_isolated_without_a_command_is_one_line() -> None:
    llmfleet = shutil.which("llmfleet") or os.path.join(os.path.dirname(sys.executable), "llmfleet")
    done = subprocess.run(
        [llmfleet, "isolated"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 1
    assert "usage: llmfleet isolated -- CMD" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("seen", "environ", "expected"),
    [
        pytest.param(["lo"], {}, None, id="loopback-only"),
        pytest.param(
            ["lo", "eth0"],
            {},
            "this process sees interfaces besides loopback (eth0): run it through "
            "`llmfleet isolated -- CMD` (make test does)",
            id="outside",
        ),
        pytest.param(
            ["lo", "eth0", "docker0"],
            {netns.UNAVAILABLE_ENV: "`unshare --net` failed: Operation not permitted"},
            "this process sees interfaces besides loopback (eth0, docker0): no loopback-only "
            "network namespace could be made here (`unshare --net` failed: Operation not "
            "permitted)",
            id="no-namespace-possible",
        ),
    ],
)
def test_isolation_problem_is_one_line(
    seen: list[str], environ: dict[str, str], expected: str | None
) -> None:
    assert netns.isolation_problem(seen, environ) == expected


SERVER_TEST = """
from tests.net import free_port

def test_starts_a_server():
    free_port()
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="`unshare --net` needs root here")
def test_a_test_that_starts_a_server_where_packets_could_leave_fails_with_one_line(
    tmp_path: Path,
) -> None:
    """A namespace with an interface besides lo (a veth pair, which leads nowhere) stands for
    the machine's own network: `free_port` fails the test with the reason, starting nothing."""
    (tmp_path / "test_server.py").write_text(SERVER_TEST)
    pytest_run = f"{sys.executable} -m pytest -q -p no:cacheprovider {tmp_path}"
    script = f"ip link add v0 type veth peer name v1 && exec {pytest_run}"
    done = subprocess.run(
        ["unshare", "--net", "--", "sh", "-c", script],
        capture_output=True, text=True, timeout=120, check=False, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "this process sees interfaces besides loopback (v1, v0)" in done.stdout or (
        "this process sees interfaces besides loopback (v0, v1)" in done.stdout
    ), done.stdout
    assert "llmfleet isolated -- CMD" in done.stdout
    assert "Traceback" not in done.stdout


def test_building_inside_the_namespace_says_what_to_do(tmp_path: Path) -> None:
    """No download can work here: a missing binary is a clear error, not a network failure."""
    require_isolation()  # outside, the build would really download
    env = {**os.environ, "LLMFLEET_CACHE_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "llmfleet.core.cli", "cluster", "build", "helm"],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "this process has no network" in done.stderr
    assert "llmfleet cluster build" in done.stderr
