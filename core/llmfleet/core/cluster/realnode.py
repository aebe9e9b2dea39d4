"""A real node in the local cluster: containerd, runc, the CNI bridge, kube-proxy and a kubelet.

`LocalCluster.up(real_node=True)` starts one next to kwok's fake GPU nodes. Its pods run for
real, from OCI archives imported into containerd (no registry is reachable here; pods use
`imagePullPolicy: Never` or `IfNotPresent`). It advertises fake GPUs as the `nvidia.com/gpu`
extended resource, so engine pods can land on it, though no device exists.

It only ever runs inside a network namespace the run made itself (`llmfleet isolated`,
`llmfleet up`): pod IPs live on a bridge there (realnode_config.POD_SUBNET). Its processes run
in a private mount namespace with their own tmpfs on /run, /var/lib and /var/log, so nothing of
theirs lands on the host's disk and their mounts vanish with them. What is host-wide and is
undone on the way down: the kubelet's kernel settings (saved first, restored), and the cgroups
it makes (all under a root of this node's own, removed). README.md ("The real node") and
realnode_config.py say why each setting is there.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import yaml

from llmfleet.core import netns
from llmfleet.core.cluster import build, pause
from llmfleet.core.cluster import realnode_config as config
from llmfleet.core.cluster.errors import ClusterError
from llmfleet.core.cluster.toolchain import TOOLS_BY_NAME

NODE_TOOLS = ("kubelet", "containerd", "runc", "cni-plugins")
NODE_IP = "192.0.2.200"
"""The node's InternalIP: the address `netns` puts on the namespace's loopback for
kube-apiserver, so the API server reaches the kubelet (logs, exec) and pods reach the API server
(through kube-proxy's rules for the `kubernetes` Service) without leaving the namespace."""

KERNEL_SETTINGS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/ipv4/ip_forward",
)
"""Host-wide settings the kubelet changes at start (`protectKernelDefaults: false`), and the
namespace's forwarding, which the node turns on (pods reach kwok pods' engines through it)."""

PRIVATE_MOUNTS = ("/run", "/var/lib", "/var/log")
KUBELET_PORT = 10250
TOOLS_ON_PATH = ("unshare", "nsenter", "ip", "iptables-restore", "gcc")
"""util-linux, iproute2, iptables (kube-proxy) and gcc (the pause program)."""
CGROUP_ROOT = Path("/sys/fs/cgroup")

Step = Callable[[str], None]

_SPAWNED: dict[int, subprocess.Popen[bytes]] = {}
"""The node's daemons started by this process, kept so that they are reaped when they exit
(a `RealNode` is rebuilt from its files for each call; the processes outlive it)."""


def unavailable_reason() -> str | None:
    """Why a real node cannot run here, in one line, or None."""
    if os.geteuid() != 0:
        return "it needs root (containerd and the kubelet manage mounts, cgroups and namespaces)"
    if netns.isolation_problem(environ={}) is not None:
        return (
            "it runs only inside a network namespace of the run's own (`llmfleet isolated`, "
            "`llmfleet up`), and this process sees other interfaces"
        )
    return _host_problem()


def _host_problem() -> str | None:
    missing = [tool for tool in TOOLS_ON_PATH if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not on PATH (`make test-tools` installs what is missing)"
    if not (CGROUP_ROOT / "memory").is_dir() and not (CGROUP_ROOT / "cgroup.controllers").exists():
        return f"no cgroup hierarchy under {CGROUP_ROOT}"
    with socket.socket() as probe:
        try:
            probe.bind(("0.0.0.0", KUBELET_PORT))
        except OSError:
            return f"another real node runs in this namespace (port {KUBELET_PORT} is taken)"
    return None


def _cgroup_hierarchies() -> list[Path]:
    """One directory per mounted hierarchy: each v1 controller, or the single v2 root."""
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        return [CGROUP_ROOT]
    return sorted(
        path
        for path in CGROUP_ROOT.iterdir()
        if path.is_dir() and not path.is_symlink() and (path / "cgroup.procs").exists()
    )


class RealNode:
    """One real node of a local cluster; its files live in `<cluster state>/node`."""

    def __init__(
        self,
        cluster_dir: Path,
        cluster_name: str,
        kubeconfig: Path,
        pki: Path,
        service_range: str = "10.96.0.0/16",
    ) -> None:
        self.name = f"{cluster_name}-real"
        self.cluster_name = cluster_name
        self.kubeconfig = kubeconfig
        self.pki = pki
        self.paths = config.NodePaths(
            dir=cluster_dir / "node",
            containerd_bin=build.bin_dir(TOOLS_BY_NAME["containerd"]),
            runc=build.binary(TOOLS_BY_NAME["runc"], "runc"),
            cni_bin=build.bin_dir(TOOLS_BY_NAME["cni-plugins"]),
        )
        # Cgroups are the host's, not the run's: two clusters of one name (two checkouts, or a
        # test run beside `make up`) must not share a root, since stopping one kills every
        # process under its root. The state folder tells them apart.
        digest = hashlib.sha256(str(cluster_dir.resolve()).encode()).hexdigest()[:8]
        self.cgroup_root = f"/llmfleet-{cluster_name}-{digest}"
        self.service_range = service_range
        """ClusterIPs: routed here (to `lo`) so that this namespace's own processes can connect
        to a Service: their first route lookup happens before kube-proxy's DNAT, and every range
        but loopback's is `unreachable` in the run's namespace (netns.py)."""

    # -- files -------------------------------------------------------------------------------

    @property
    def _pid_dir(self) -> Path:
        return self.paths.dir / "pids"

    @property
    def _saved_settings(self) -> Path:
        return self.paths.dir / "kernel-settings.json"

    def _write_configs(self) -> None:
        paths = self.paths
        for directory in (paths.dir, paths.cni_conf_dir, paths.logs, self._pid_dir):
            directory.mkdir(parents=True, exist_ok=True)
        paths.containerd_config.write_text(config.containerd_toml(paths))
        (paths.cni_conf_dir / "10-llmfleet.conflist").write_text(
            json.dumps(config.cni_conflist(paths), indent=2) + "\n"
        )
        kubelet = config.kubelet_configuration(
            paths, cgroup_root=self.cgroup_root, client_ca=self.pki / "ca.crt", node_ip=NODE_IP
        )
        paths.kubelet_config.write_text(yaml.safe_dump(kubelet))
        proxy = config.kube_proxy_configuration(self.kubeconfig, self.name)
        paths.kube_proxy_config.write_text(yaml.safe_dump(proxy))
        # No resolver: nothing in a pod may send a DNS query towards the host's.
        paths.resolv_conf.write_text("nameserver 127.0.0.1\n")

    # -- life cycle --------------------------------------------------------------------------

    def start(
        self,
        labels: dict[str, str],
        gpus: int,
        images: list[Path],
        step: Step = lambda _: None,
        timeout: float = 90,
    ) -> None:
        """Start containerd, import `images` (and the pause image), start kube-proxy and the
        kubelet, wait for the node to be Ready and advertise `gpus` fake GPUs."""
        reason = unavailable_reason()
        if reason is not None:
            raise ClusterError(f"no real node: {reason}")
        self._write_configs()
        self._save_kernel_settings()
        self._make_cgroup_root()
        Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")  # this namespace's only
        subprocess.run(
            ["ip", "route", "replace", self.service_range, "dev", "lo"],
            capture_output=True, check=True, timeout=10,
        )  # fmt: skip
        env = {
            **os.environ,
            "PATH": os.pathsep.join(
                [str(self.paths.containerd_bin), str(self.paths.runc.parent), os.environ["PATH"]]
            ),
        }
        mounts = " && ".join(f"mount -t tmpfs -o mode=0755 llmfleet {m}" for m in PRIVATE_MOUNTS)
        containerd = build.binary(TOOLS_BY_NAME["containerd"], "containerd")
        step("starting containerd (private mounts: " + ", ".join(PRIVATE_MOUNTS) + ")")
        pid = self._spawn(
            "containerd",
            ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
             f'{mounts} && exec "$0" --config "$1"', str(containerd),
             str(self.paths.containerd_config)],
            env,
        )  # fmt: skip
        self._wait(lambda: self._ctr("version", check=False) == 0, 30, "containerd's socket")
        for archive in [pause.archive(), *images]:
            step(f"importing {archive.name} into containerd")
            self._ctr("images", "import", "--no-unpack=false", str(archive))
        enter = ["nsenter", f"--mount=/proc/{pid}/ns/mnt", "--"]
        kubelet_bin = TOOLS_BY_NAME["kubelet"]
        step("starting kube-proxy and the kubelet")
        self._spawn(
            "kube-proxy",
            [*enter, str(build.binary(kubelet_bin, "kube-proxy")),
             f"--config={self.paths.kube_proxy_config}"],
            env,
        )  # fmt: skip
        self._spawn(
            "kubelet",
            [*enter, str(build.binary(kubelet_bin, "kubelet")),
             f"--config={self.paths.kubelet_config}", f"--kubeconfig={self.kubeconfig}",
             f"--hostname-override={self.name}", f"--node-ip={NODE_IP}",
             "--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(labels.items()))],
            env,
        )  # fmt: skip
        self._wait(self._registered, timeout, f"node {self.name} to register")
        self._advertise_gpus(gpus)
        self._kubectl("wait", "--for=condition=Ready", f"--timeout={int(timeout)}s",
                      f"node/{self.name}", timeout=timeout + 10)  # fmt: skip

    def stop(self, network: bool = True) -> list[str]:
        """Kill every process of the node (containers first), remove its cgroups, restore the
        kernel settings; returns the names of the node's daemons that were still running.

        `network=False` leaves kube-proxy's rules and the bridge alone: for a caller outside
        the node's namespace (a crashed system's cleanup), where they do not exist and where
        the same commands would touch the machine's own network."""
        # A pid file may outlive its process (a crash) and its number be reused: only a process
        # whose command line names this node's files is ours.
        daemons = {name: pid for name, pid in self._pids().items() if self._ours(pid)}
        stopped = sorted(daemons)
        for name, pid in daemons.items():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM if name != "containerd" else signal.SIGKILL)
        self._kill_containers()
        for pid in daemons.values():
            _wait_gone(pid, 10)
        self._remove_cgroup_root()
        if network:
            self._remove_network()
        self._restore_kernel_settings()
        return stopped

    def _ours(self, pid: int) -> bool:
        try:
            process = psutil.Process(pid)
            return process.status() != psutil.STATUS_ZOMBIE and str(self.paths.dir) in " ".join(
                process.cmdline()
            )
        except psutil.Error:
            return False

    def _remove_network(self) -> None:
        """kube-proxy's rules and the pod bridge, which outlive the processes in the namespace."""
        if not self.paths.kube_proxy_config.exists():
            return
        proxy = build.binary(TOOLS_BY_NAME["kubelet"], "kube-proxy")
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(
                [str(proxy), "--cleanup", f"--config={self.paths.kube_proxy_config}"],
                capture_output=True, check=False, timeout=30,
            )  # fmt: skip
            for command in (
                ["ip", "link", "delete", config.BRIDGE],
                ["ip", "route", "delete", self.service_range, "dev", "lo"],
            ):
                subprocess.run(command, capture_output=True, check=False, timeout=10)

    # -- helpers -----------------------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> int:
        log = (self.paths.logs / f"{name}.log").open("ab")
        process = subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        log.close()
        _SPAWNED[process.pid] = process
        (self._pid_dir / f"{name}.pid").write_text(f"{process.pid}\n")
        return process.pid

    def _pids(self) -> dict[str, int]:
        found: dict[str, int] = {}
        if self._pid_dir.is_dir():
            for file in self._pid_dir.glob("*.pid"):
                text = file.read_text().strip()
                if text.isdigit():
                    found[file.stem] = int(text)
        return found

    def _ctr(self, *args: str, check: bool = True) -> int:
        ctr = build.binary(TOOLS_BY_NAME["containerd"], "ctr")
        result = subprocess.run(
            [str(ctr), "--address", str(self.paths.socket), "-n", "k8s.io", *args],
            capture_output=True, text=True, check=False, timeout=300,
        )  # fmt: skip
        if check and result.returncode != 0:
            raise ClusterError(f"ctr {' '.join(args[:2])} failed: {result.stderr.strip()[-400:]}")
        return result.returncode

    def _kubectl(self, *args: str, timeout: float = 30) -> str:
        kubectl = build.binary(TOOLS_BY_NAME["kubernetes"], "kubectl")
        result = subprocess.run(
            [str(kubectl), "--kubeconfig", str(self.kubeconfig), *args],
            capture_output=True, text=True, check=False, timeout=timeout,
        )  # fmt: skip
        if result.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args[:2])}: {result.stderr.strip()}")
        return result.stdout

    def _registered(self) -> bool:
        for name, pid in self._pids().items():
            if not _alive(pid):
                raise ClusterError(
                    f"the real node's {name} exited; its log: {self.paths.logs / f'{name}.log'}"
                    + _tail(self.paths.logs / f"{name}.log")
                )
        try:
            self._kubectl("get", "node", self.name, "-o", "name", timeout=10)
        except ClusterError:
            return False
        return True

    def _advertise_gpus(self, gpus: int, timeout: float = 60) -> None:
        """An extended resource the kubelet keeps: set in the node's status capacity, then wait
        until the node's allocatable carries it. The scheduler filters on allocatable, which the
        kubelet derives from capacity at its next status update (every 10 s); pods applied
        before that found no GPU on the real node and all went to the fake nodes (CI did)."""
        patch = [{"op": "add", "path": "/status/capacity/nvidia.com~1gpu", "value": str(gpus)}]
        self._kubectl("patch", "node", self.name, "--subresource=status", "--type=json",
                      "-p", json.dumps(patch))  # fmt: skip
        self._wait(lambda: self._allocatable_gpus() == gpus, timeout,
                   f"node {self.name} to offer its {gpus} GPUs (status.allocatable)")  # fmt: skip

    def _allocatable_gpus(self) -> int | None:
        jsonpath = "-o=jsonpath={.status.allocatable.nvidia\\.com/gpu}"
        value = self._kubectl("get", "node", self.name, jsonpath, timeout=10).strip()
        return int(value) if value.isdigit() else None

    def _wait(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return
            time.sleep(0.3)
        raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}")

    def _save_kernel_settings(self) -> None:
        if self._saved_settings.exists():  # a node that crashed: keep the first saved values
            return
        saved = {key: (Path("/proc/sys") / key).read_text().strip() for key in KERNEL_SETTINGS}
        self._saved_settings.write_text(json.dumps(saved) + "\n")

    def _restore_kernel_settings(self) -> None:
        if not self._saved_settings.exists():
            return
        for key, value in json.loads(self._saved_settings.read_text()).items():
            with contextlib.suppress(OSError):
                (Path("/proc/sys") / key).write_text(value + "\n")
        self._saved_settings.unlink()

    def _make_cgroup_root(self) -> None:
        for hierarchy in _cgroup_hierarchies():
            directory = hierarchy / self.cgroup_root.lstrip("/")
            directory.mkdir(exist_ok=True)
            for name in ("cpuset.cpus", "cpuset.mems"):  # an empty cpuset admits no task
                own, parent = directory / name, hierarchy / name
                if own.exists() and not own.read_text().strip():
                    own.write_text(parent.read_text())

    def _cgroups(self) -> list[Path]:
        """Every cgroup under this node's root, deepest first, the root last."""
        found: list[Path] = []
        for hierarchy in _cgroup_hierarchies():
            root = hierarchy / self.cgroup_root.lstrip("/")
            if root.is_dir():
                found += sorted(
                    (path for path in root.rglob("*") if path.is_dir()),
                    key=lambda path: len(path.parts), reverse=True,
                )  # fmt: skip
                found.append(root)
        return found

    def container_pids(self) -> set[int]:
        """Every process of the node's containers (its cgroups'), as seen from the host."""
        return {
            int(line)
            for cgroup in self._cgroups()
            for line in _read_lines(cgroup / "cgroup.procs")
            if line.isdigit()
        }

    def _kill_containers(self) -> None:
        """SIGKILL every process in the node's cgroups (pods) and every shim of its socket."""
        socket = str(self.paths.socket)
        for process in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error):
                if socket in " ".join(process.info["cmdline"] or ()):
                    process.kill()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            pids = self.container_pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)

    def _remove_cgroup_root(self) -> None:
        for cgroup in self._cgroups():
            with contextlib.suppress(OSError):
                cgroup.rmdir()


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def _wait_gone(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    spawned = _SPAWNED.pop(pid, None)
    if spawned is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            spawned.wait(timeout=5)


def _tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return "\n  " + "\n  ".join(text[-lines:])
