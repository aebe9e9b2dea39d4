"""Run a command inside a network namespace of its own that has only loopback.

The network rule of our machines: nothing may send a packet outside 127.0.0.0/8 and ::1 except to
addresses inside a namespace the run made itself. `make test` runs pytest through
`llmfleet isolated`, so whatever the code under test does, no packet can leave the machine: in a
fresh namespace (`unshare --net`) the only interface is `lo`.

Inside, `lo` also carries `ADVERTISE_ADDRESS` and a default route, because kube-apiserver picks
its advertise address from the default route and does not start without one
(README, "The local cluster: how it is built and cached"). Every IPv4 range but 0.0.0.0/8 is
then made `unreachable`, so a stray connection (to a kwok pod IP, 10.0.0.x, say) fails at once
with "No route to host" instead of timing out on the loopback default route. The routes are
more specific than the default but never have destination 0.0.0.0, since kube-apiserver reads
every such line of /proc/net/route as a default route. Addresses added to `lo` later (pod IPs
an engine should listen on) are local and win over these routes.

Where no namespace can be made (not root, no `unshare`), the command runs outside it with
`UNAVAILABLE_ENV` saying why; `isolation_problem()` then tells tests that start servers or
clusters what to fail with.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping
from typing import NoReturn

from llmfleet.core import loopback

ADVERTISE_ADDRESS = "192.0.2.200"
"""TEST-NET-1 (RFC 5737): exists only on the namespace's loopback, for kube-apiserver."""

UNREACHABLE = (
    "1.0.0.0/8",
    "2.0.0.0/7",
    "4.0.0.0/6",
    "8.0.0.0/5",
    "16.0.0.0/4",
    "32.0.0.0/3",
    "64.0.0.0/2",
    "128.0.0.0/1",
)
"""Every IPv4 address outside 0.0.0.0/8, in prefixes none of which starts at 0.0.0.0."""

UNAVAILABLE_ENV = "LLMFLEET_NETNS_UNAVAILABLE"
"""Set (to the reason) when `isolated` could not make a namespace and ran the command outside."""


def setup_commands() -> list[list[str]]:
    """The `ip` commands that prepare a fresh namespace (run inside it)."""
    commands = [
        ["ip", "link", "set", "lo", "up"],
        ["ip", "addr", "add", f"{ADVERTISE_ADDRESS}/32", "dev", "lo"],
        ["ip", "route", "add", "default", "dev", "lo"],
    ]
    commands += [["ip", "route", "add", "unreachable", prefix] for prefix in UNREACHABLE]
    return commands


RUN_BRIDGE = "llmfleet0"
"""The real node's pod bridge (cluster/realnode_config.py), made inside the run's namespace."""

POD_LINK_PREFIX = "lfh"
"""Host ends of the pod runner's veth pairs (local/podnet.py)."""


def interfaces() -> list[str]:
    """The network interfaces this process sees."""
    return [name for _, name in socket.if_nameindex()]


def run_made(links: list[dict[str, object]]) -> list[str]:
    """Of `ip -d -j link` entries, the names of links the run made inside its own namespace:
    the real node's pod bridge, the veths enslaved to it, the pod runner's veths. Their other
    ends lie in pod namespaces the run made; none is a way off the machine (pure)."""
    made: list[str] = []
    for link in links:
        name = str(link.get("ifname", ""))
        info = link.get("linkinfo")
        kind = info.get("info_kind") if isinstance(info, dict) else None
        bridged = link.get("master") == RUN_BRIDGE or name.startswith(POD_LINK_PREFIX)
        if (name == RUN_BRIDGE and kind == "bridge") or (kind == "veth" and bridged):
            made.append(name)
    return made


def _run_made_here() -> list[str]:
    try:
        listing = subprocess.run(
            ["ip", "-d", "-j", "link", "show"], capture_output=True, text=True, timeout=10,
            check=False,
        )  # fmt: skip
        links = json.loads(listing.stdout) if listing.returncode == 0 else []
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return []
    return run_made(links if isinstance(links, list) else [])


def isolation_problem(
    seen: list[str] | None = None, environ: Mapping[str, str] | None = None
) -> str | None:
    """None when this process sees no interface but `lo`; else one line saying why it is not
    isolated (for tests that must not start servers or clusters outside a namespace).
    `seen` and `environ` default to this process's interfaces and environment."""
    others = [name for name in (interfaces() if seen is None else seen) if name != "lo"]
    if others and seen is None:  # links the run made itself (a real node's pods) are inside
        made = set(_run_made_here())
        others = [name for name in others if name not in made]
    if not others:
        return None
    problem = f"this process sees interfaces besides loopback ({', '.join(others)})"
    why = (os.environ if environ is None else environ).get(UNAVAILABLE_ENV)
    if why:
        return f"{problem}: no loopback-only network namespace could be made here ({why})"
    return f"{problem}: run it through `llmfleet isolated -- CMD` (make test does)"


def unavailable_reason() -> str | None:
    """Why `unshare --net` cannot work here, or None when it does."""
    for tool in ("unshare", "ip"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not on PATH (util-linux and iproute2 provide them)"
    try:
        probe = subprocess.run(
            ["unshare", "--net", "--", "ip", "link", "set", "lo", "up"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"`unshare --net` failed: {error}"
    if probe.returncode != 0:
        said = (probe.stderr or probe.stdout).strip().splitlines()
        return f"`unshare --net` failed: {said[-1] if said else f'exit {probe.returncode}'}"
    return None


def exec_isolated(argv: list[str], announce: bool = True) -> NoReturn:
    """Replace this process with `argv` run in a new loopback-only namespace, with
    `LLMFLEET_LOOPBACK_ONLY` on; where none can be made, run it outside with `UNAVAILABLE_ENV`."""
    env = {**os.environ, loopback.ENV: "true"}
    env.pop(UNAVAILABLE_ENV, None)
    reason = unavailable_reason()
    if reason is not None:
        print(
            f"llmfleet isolated: {reason}; running outside a namespace (tests that start "
            "servers or clusters will fail)",
            file=sys.stderr,
        )
        env[UNAVAILABLE_ENV] = reason
        os.execvpe(argv[0], argv, env)
    if announce:
        print(
            "llmfleet isolated: in a new network namespace with only loopback "
            f"({ADVERTISE_ADDRESS} and a default route on lo for kube-apiserver; "
            "every other IPv4 range unreachable)",
            file=sys.stderr,
        )
    inner = [sys.executable, "-m", "llmfleet.core.netns", *argv]
    os.execvpe("unshare", ["unshare", "--net", "--", *inner], env)


def _inside(argv: list[str]) -> NoReturn:
    """Prepare the fresh namespace, then become `argv`."""
    if interfaces() != ["lo"]:  # never touch the routes of a namespace we did not make
        sys.exit(f"llmfleet isolated: not in a fresh network namespace (sees {interfaces()})")
    for command in setup_commands():
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            print(
                f"llmfleet isolated: `{' '.join(command)}` failed: {done.stderr.strip()}",
                file=sys.stderr,
            )
            sys.exit(1)
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python -m llmfleet.core.netns CMD [ARG...] (inside `unshare --net`)")
    _inside(sys.argv[1:])
