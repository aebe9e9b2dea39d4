"""A network of their own for the engines behind the local cluster's pods.

kwok gives every pod an IP in `POD_NETWORK` but runs nothing; the pod runner starts one engine
per pod. Each engine runs in a network namespace of its own (`unshare --net`), joined to the
local system's namespace by a veth pair: the pod's end is `eth0` carrying the pod IP, the host's
end carries a /32 route to it. So the engine listens on its real pod IP and port 8000, and the
gateway, the operator's probe and Prometheus reach it exactly as in a cluster, with no local
special case in their code. This only ever runs inside a namespace the run made itself
(`llmfleet up`, `llmfleet isolated`): the pod IPs exist nowhere else.

`ip`, `nsenter` and `unshare` (iproute2 and util-linux) do the work; the caller must hold
CAP_NET_ADMIN in the namespace (root, or root of a user namespace).
"""

from __future__ import annotations

import hashlib
import ipaddress
import subprocess
from pathlib import Path

from llmfleet.core import netns
from llmfleet.core.cluster import local

POD_NETWORK = local.POD_NETWORK
"""The local cluster's pod CIDR (kwok's `--cidr`)."""

HOST_PREFIX = netns.POD_LINK_PREFIX
"""Names of the host ends of pod links start with this (`lfh<hash>`, at most 15 characters)."""


class PodNetError(RuntimeError):
    """A pod's link could not be made (the message names the `ip` command and its error)."""


def link_name(pod_ip: str) -> str:
    """The host end's interface name for a pod IP (short, stable, unique per IP)."""
    return HOST_PREFIX + hashlib.sha256(pod_ip.encode()).hexdigest()[:10]


def in_pod_network(pod_ip: str) -> bool:
    try:
        return ipaddress.ip_address(pod_ip) in ipaddress.ip_network(POD_NETWORK)
    except ValueError:
        return False


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=10, check=False)
    if done.returncode != 0:
        raise PodNetError(f"`{' '.join(command)}` failed: {done.stderr.strip()}")


def attach(pid: int, pod_ip: str) -> str:
    """Give the network namespace of process `pid` the address `pod_ip` on an `eth0` linked to
    this namespace, and route `pod_ip` here to it; returns the host end's name.

    A link left by an earlier engine of the same pod IP is replaced."""
    if not in_pod_network(pod_ip):
        raise PodNetError(f"pod IP {pod_ip!r} is not in the pod network {POD_NETWORK}")
    host = link_name(pod_ip)
    peer = "lfp" + host[len(HOST_PREFIX) :]
    detach(pod_ip)
    _run(["ip", "link", "add", host, "type", "veth", "peer", "name", peer])
    try:
        _run(["ip", "link", "set", peer, "netns", str(pid)])
        inside = ["nsenter", f"--net=/proc/{pid}/ns/net", "--"]
        _run([*inside, "ip", "link", "set", "lo", "up"])
        _run([*inside, "ip", "link", "set", peer, "name", "eth0"])
        _run([*inside, "ip", "addr", "add", f"{pod_ip}/32", "dev", "eth0"])
        _run([*inside, "ip", "link", "set", "eth0", "up"])
        _run([*inside, "ip", "route", "add", "default", "dev", "eth0"])
        _run(["ip", "link", "set", host, "up"])
        _run(["ip", "route", "replace", f"{pod_ip}/32", "dev", host])
        # The engine's default route is on-link, so it asks ARP for whatever address it answers.
        # This namespace answers for its own addresses anyway; proxy ARP makes it answer for
        # the addresses it routes elsewhere too: the real node's pods (the gateway pod behind
        # the bridge) reach an engine on a kwok node only with it.
        _enable_proxy_arp(host)
    except PodNetError:
        detach(pod_ip)
        raise
    return host


def _enable_proxy_arp(link: str) -> None:
    try:
        Path(f"/proc/sys/net/ipv4/conf/{link}/proxy_arp").write_text("1")
    except OSError as error:
        raise PodNetError(f"proxy ARP on {link}: {error}") from error


def detach(pod_ip: str) -> None:
    """Remove the host end of a pod's link, if any (the pod's end goes with it; a namespace
    whose last process exited has already taken both)."""
    subprocess.run(
        ["ip", "link", "del", link_name(pod_ip)], capture_output=True, timeout=10, check=False
    )
