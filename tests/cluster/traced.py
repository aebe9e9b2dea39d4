"""The connections a process really attempts, seen from outside it: `strace -f -e trace=connect`.

The process's own counters could lie if its guard were bypassed (a library opening sockets of its
own, uvloop's C connect); the kernel's syscall log cannot. Every `connect()` of every thread and
child lands in one file, with its destination and result.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psutil

from llmfleet.core.loopback import is_loopback

_INET = re.compile(r'sin_port=htons\((\d+)\), sin_addr=inet_addr\("([^"]+)"\)')
_INET6 = re.compile(r'sin6_port=htons\((\d+)\).*?inet_pton\(AF_INET6, "([^"]+)"')


def traced(argv: list[str], log: Path) -> list[str]:
    """`argv` run under strace, every connect() (threads and children too) written to `log`."""
    strace = shutil.which("strace")
    assert strace is not None, "strace is not on PATH (the Makefile's test target installs it)"
    return [strace, "-f", "-qq", "-e", "trace=connect", "-o", str(log), *argv]


@dataclass(frozen=True)
class Connect:
    address: str
    port: int
    line: str


def connects(log: Path) -> list[Connect]:
    """Every IPv4/IPv6 connect() in the log (Unix sockets and AF_UNSPEC are not network)."""
    found = []
    for line in log.read_text(errors="replace").splitlines():
        match = _INET.search(line) or _INET6.search(line)
        if match is not None:
            found.append(Connect(match[2], int(match[1]), line.strip()))
    return found


def off_loopback(log: Path) -> list[Connect]:
    return [c for c in connects(log) if not is_loopback(c.address)]


def tracee(process: subprocess.Popen[bytes]) -> psutil.Process:
    """The traced command (strace's child): signals go to it, strace exits with it."""
    children = psutil.Process(process.pid).children()
    assert children, "strace has no child: the traced command did not start"
    return children[0]
