"""One named local cluster: kwokctl's binary runtime over our cached binaries, plus fake GPU nodes.

State lives in `<state>/clusters/<name>/` (`$LLMFLEET_STATE_DIR`, else `~/.local/state/llmfleet`):
`kubeconfig` (the one file users point KUBECONFIG at), `kwokctl.yaml` (the configuration we
generate), `kwok/` (kwokctl's work dir: pids, logs, certificates), `cluster.json` (how it was
started) and, when asked for, `audit/` (the API server's audit policy and log).
`~/.kube/config` is never read or written.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil
import yaml

from llmfleet.core import loopback, netns
from llmfleet.core.cluster import build, nodes, realnode, realnode_config, stages
from llmfleet.core.cluster.errors import ClusterError
from llmfleet.core.cluster.nodes import NodePool
from llmfleet.core.cluster.toolchain import TOOLS_BY_NAME

DEFAULT_NAME = "llmfleet"
CLUSTER_TOOLS = ("kubernetes", "etcd", "kwok")
"""Tools `up` needs; helm and the engine simulator are built on demand by their users."""
POD_NETWORK = "10.0.0.0/16"
"""The fake nodes' pod IPs (kwok's `--cidr`): 65,534 addresses, so a fleet of thousands of pods
gets one each (kwok's default /24 hands out addresses past its end once 254 are taken)."""
SERVICE_RANGE = "10.96.0.0/16"
"""ClusterIPs: apart from kwok's pod IPs (`POD_NETWORK`),
whose engines a real node's pods reach by address, and with room for thousands of Services."""
SERVICE_IP = "10.96.0.1"
"""The `kubernetes` Service's ClusterIP: the first of `SERVICE_RANGE`."""
FAKE_NODE_TAINT = {"key": "llmfleet.dev/fake-node", "value": "true", "effect": "PreferNoSchedule"}
"""With a real node, kwok's nodes carry this: a pod goes to a fake node only when it does not
fit the real one (the scheduler's taint score outweighs its resource scores)."""

AUDIT_POLICY: dict[str, Any] = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    # One event per request, when its response is complete (and one for a watch's start).
    "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata"}],
}
"""Every request at level Metadata: who (user, user agent), verb, resource, status; no bodies."""
AUDIT_LOG_MAX_MB = 200
AUDIT_LOG_BACKUPS = 4
"""The audit log rotates at `AUDIT_LOG_MAX_MB` and keeps `AUDIT_LOG_BACKUPS` old files beside it
(`audit-<time>.log`): at most 1 GB however long the cluster runs."""

Step = Callable[[str], None]


def state_root() -> Path:
    configured = os.environ.get("LLMFLEET_STATE_DIR")
    return Path(configured) if configured else Path.home() / ".local" / "state" / "llmfleet"


@dataclass(frozen=True)
class ClusterSpec:
    """How a cluster was asked for; written to `cluster.json` so `status` can report it."""

    name: str
    pools: tuple[NodePool, ...]
    port: int
    runner_owns_engines: bool = False
    """Engine pods stay not Ready until a pod runner says so (stages.py); else kwok makes every
    pod Ready at once."""
    real_node: bool = False
    """A real node (kubelet, containerd, runc; realnode.py) runs next to the fake ones."""
    audit_log: bool = False
    """The API server writes an audit log (`AUDIT_POLICY`; `LocalCluster.audit_log`)."""

    def to_json(self) -> str:
        return json.dumps(asdict(self)) + "\n"

    @classmethod
    def from_json(cls, text: str) -> ClusterSpec:
        """Reads `to_json`'s text, and the single-pool form written before node pools existed
        (`nodes`, `gpus_per_node`, `gpu_type`), so a cluster started then still reports."""
        data = json.loads(text)
        if "pools" in data:
            pools = tuple(NodePool(**pool) for pool in data["pools"])
        else:
            pools = (NodePool(data["gpu_type"], data["nodes"], data["gpus_per_node"]),)
        return cls(
            name=data["name"],
            pools=pools,
            port=data["port"],
            runner_owns_engines=data.get("runner_owns_engines", False),
            real_node=data.get("real_node", False),
            audit_log=data.get("audit_log", False),
        )


@dataclass(frozen=True)
class NodeRow:
    name: str
    ready: str
    """The node's Ready condition status."""
    gpu_type: str
    """From its `nvidia.com/gpu.product` label (the label itself for an unknown product)."""
    gpus: str
    """Allocatable `nvidia.com/gpu`."""


@dataclass(frozen=True)
class ClusterStatus:
    name: str
    exists: bool
    api_ready: bool
    running_components: tuple[str, ...]
    kubeconfig: Path
    spec: ClusterSpec | None
    nodes: tuple[NodeRow, ...]


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def kwokctl_documents(
    spec: ClusterSpec, binaries: dict[str, Path], pki: Path | None = None,
    audit: Path | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    """kwokctl's configuration file: the KwokctlConfiguration and our kwok Stages (pure)."""
    return [
        kwokctl_config(spec, binaries, pki, audit),
        *stages.stages(runner_owns_engines=spec.runner_owns_engines),
    ]


def kwokctl_config(
    spec: ClusterSpec, binaries: dict[str, Path], pki: Path | None = None,
    audit: Path | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The KwokctlConfiguration: local binaries only, every component on 127.0.0.1 (pure).

    With a real node the API server also listens on the namespace's own address (pods reach it
    there through the `kubernetes` Service), its certificate names that address and the Service's,
    and it authenticates to the kubelet with the cluster's client certificate (`pki`: kwokctl's
    directory of it). kwok manages only the nodes annotated as fake, never the real one.

    With `spec.audit_log` the API server audits every request into `audit/audit.log` (`audit`:
    that directory, where `policy.yaml` holds `AUDIT_POLICY`), rotated at `AUDIT_LOG_MAX_MB`.
    NOTE: kwokctl's own `kubeAuditPolicy` option passes the same two flags (its binary runtime
    hands host paths through unchanged) but puts the log in its work dir and bounds nothing; the
    flags here keep the policy, the log and its bound in one place."""
    apiserver_args = [
        # Pods that request nvidia.com/gpu get the toleration for the GPU taint.
        {"key": "enable-admission-plugins", "value": "ExtendedResourceToleration"},
        # Never a node's hostname: its lookup would go to the host's resolver.
        {"key": "kubelet-preferred-address-types", "value": "InternalIP"},
        {"key": "service-cluster-ip-range", "value": SERVICE_RANGE},
    ]
    options: dict[str, Any] = {}
    if spec.real_node:
        assert pki is not None, "a real node needs the cluster's pki directory"
        apiserver_args += [
            {"key": "bind-address", "value": "0.0.0.0"},  # inside the run's namespace only
            {"key": "kubelet-client-certificate", "value": str(pki / "admin.crt")},
            {"key": "kubelet-client-key", "value": str(pki / "admin.key")},
        ]
        options["kubeApiserverCertSANs"] = [SERVICE_IP, netns.ADVERTISE_ADDRESS]
    if spec.audit_log:
        assert audit is not None, "an audit log needs the cluster's audit directory"
        apiserver_args += [
            {"key": "audit-policy-file", "value": str(audit / "policy.yaml")},
            {"key": "audit-log-path", "value": str(audit / "audit.log")},
            {"key": "audit-log-format", "value": "json"},
            {"key": "audit-log-maxsize", "value": str(AUDIT_LOG_MAX_MB)},
            {"key": "audit-log-maxbackup", "value": str(AUDIT_LOG_BACKUPS)},
        ]
    return {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokctlConfiguration",
        "options": {
            "runtime": "binary",
            "bindAddress": "127.0.0.1",
            "kubeApiserverPort": spec.port,
            "kubeVersion": TOOLS_BY_NAME["kubernetes"].version,
            "etcdVersion": TOOLS_BY_NAME["etcd"].version,
            "kwokVersion": TOOLS_BY_NAME["kwok"].version,
            "kubeApiserverBinary": str(binaries["kube-apiserver"]),
            "kubeControllerManagerBinary": str(binaries["kube-controller-manager"]),
            "kubeSchedulerBinary": str(binaries["kube-scheduler"]),
            "kubectlBinary": str(binaries["kubectl"]),
            "etcdBinary": str(binaries["etcd"]),
            "kwokControllerBinary": str(binaries["kwok"]),
            # Admission on, so the cluster behaves like a real one (webhooks, ServiceAccount, …).
            "kubeAdmission": True,
            "kubeAuthorization": True,
            **options,
        },
        "componentsPatches": [
            {"name": "kube-apiserver", "extraArgs": apiserver_args},
            {
                # kwokctl's binary runtime starts kwok with --manage-all-nodes=true, which takes
                # over a real node too (its status, its lease, its pods' IPs); the last flag wins.
                "name": "kwok-controller",
                "extraArgs": [
                    {"key": "manage-all-nodes", "value": "false"},
                    {"key": "cidr", "value": POD_NETWORK},
                    {
                        "key": "manage-nodes-with-annotation-selector",
                        "value": f"{nodes.KWOK_ANNOTATION}=fake",
                    },
                ],
            },
        ],
    }


class LocalCluster:
    """Start, stop and inspect one named local cluster."""

    def __init__(self, name: str = DEFAULT_NAME, state: Path | None = None) -> None:
        self.name = name
        self.dir = (state or state_root()) / "clusters" / name
        self.kubeconfig = self.dir / "kubeconfig"
        self.workdir = self.dir / "kwok"
        self.audit_dir = self.dir / "audit"
        self.audit_log = self.audit_dir / "audit.log"
        """The API server's audit log (JSON lines), when the cluster was started with
        `audit_log`; rotated copies lie beside it (`AUDIT_LOG_MAX_MB`)."""

    # -- paths and small helpers -------------------------------------------------------------

    @property
    def _spec_file(self) -> Path:
        return self.dir / "cluster.json"

    @property
    def _cluster_dir(self) -> Path:
        return self.workdir / "clusters" / self.name

    def spec(self) -> ClusterSpec | None:
        if not self._spec_file.is_file():
            return None
        return ClusterSpec.from_json(self._spec_file.read_text())

    @staticmethod
    def binaries() -> dict[str, Path]:
        found: dict[str, Path] = {}
        for tool_name in (*CLUSTER_TOOLS, "helm"):
            tool = TOOLS_BY_NAME[tool_name]
            for binary in tool.binaries:
                found[binary] = build.binary(tool, binary)
        return found

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["KWOK_WORKDIR"] = str(self.workdir)
        env["KUBECONFIG"] = str(self.kubeconfig)
        # Every process the local tooling starts keeps off kwok's pod IPs (loopback.py).
        env[loopback.ENV] = "true"
        bin_dirs = [str(build.bin_dir(TOOLS_BY_NAME[name])) for name in CLUSTER_TOOLS]
        env["PATH"] = os.pathsep.join([*bin_dirs, env.get("PATH", "")])
        return env

    def _kwokctl(self, *args: str, timeout: float = 180) -> str:
        kwokctl = str(self.binaries()["kwokctl"])
        result = subprocess.run(
            [kwokctl, *args],
            env=self._env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0:
            detail = (result.stderr or result.stdout).strip().splitlines()
            raise ClusterError(f"kwokctl {args[0]} failed: {' | '.join(detail[-3:])}")
        return result.stdout

    def kubectl(self, *args: str, stdin: str | None = None, timeout: float = 60) -> str:
        """Run our kubectl against this cluster; a failure is a ClusterError with its message."""
        result = subprocess.run(
            [str(self.binaries()["kubectl"]), "--kubeconfig", str(self.kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args[:2])}: {result.stderr.strip()}")
        return result.stdout

    def pids(self) -> dict[str, int]:
        """Component name -> pid, from the pid files kwokctl's binary runtime writes."""
        pid_dir = self._cluster_dir / "pids"
        found: dict[str, int] = {}
        if pid_dir.is_dir():
            for pid_file in pid_dir.glob("*.pid"):
                text = pid_file.read_text().strip()
                if text.isdigit():
                    found[pid_file.stem] = int(text)
        return found

    def running_components(self) -> tuple[str, ...]:
        return tuple(sorted(name for name, pid in self.pids().items() if _alive(pid)))

    # -- life cycle --------------------------------------------------------------------------

    def up(
        self,
        node_count: int | None = None,
        *,
        gpus_per_node: int = 8,
        gpu_type: str | None = None,
        pools: Sequence[NodePool] | None = None,
        port: int | None = None,
        runner_owns_engines: bool = False,
        real_node: bool = False,
        real_node_images: Sequence[Path] = (),
        real_node_gpus: NodePool | None = None,
        audit_log: bool = False,
        step: Step = lambda _: None,
        build_progress: build.Progress | None = None,
    ) -> ClusterSpec:
        """Build what is missing, start the control plane, create the GPU nodes, wait for Ready.

        The nodes: `node_count` nodes of `gpu_type` when either is given (one pool), else
        `pools`, else `nodes.DEFAULT_POOLS` (`nodes.choose_pools`). Arguments are validated
        before anything starts, so bad input changes nothing.

        `real_node` adds a real node (realnode.py) with `real_node_images` imported into its
        containerd, carrying the fake GPUs of `real_node_gpus` (one node of it; default: the
        first pool's type); the fake nodes then carry `FAKE_NODE_TAINT`. Where this host cannot
        run a real node, `step` says why in one line and the cluster comes up without it
        (`ClusterSpec.real_node` says which happened).

        `audit_log` has the API server audit every request into `self.audit_log` (off by
        default: each request then costs a line of JSON on disk).
        """
        chosen = nodes.choose_pools(pools, node_count, gpu_type, gpus_per_node)
        node_manifests = nodes.pool_nodes(chosen)
        if port is not None and not 1 <= port <= 65535:
            raise ClusterError(f"--port must be between 1 and 65535, got {port}")
        if self.running_components():
            existing = self.spec()
            raise ClusterError(
                f"cluster {self.name!r} is already running"
                + (f" on 127.0.0.1:{existing.port}" if existing else "")
                + f"; `llmfleet cluster down --name {self.name}` first"
            )
        if port is not None and port_in_use(port):
            raise ClusterError(
                f"port 127.0.0.1:{port} is already in use; pick another with --port "
                "(or omit it to choose a free one)"
            )

        if real_node and (reason := realnode.unavailable_reason()) is not None:
            step(f"no real node here: {reason}; its pods run on fake nodes only")
            real_node = False
        names = (*CLUSTER_TOOLS, *(realnode.NODE_TOOLS if real_node else ()))
        tools = [TOOLS_BY_NAME[name] for name in names]
        missing = build.missing_tools(tools)
        if missing:
            build.check_go()
            step(f"building {', '.join(tool.key for tool in missing)} from Go modules (cold cache)")
            build.ensure_tools(tools, progress=build_progress)

        spec = ClusterSpec(
            self.name, chosen, port or free_port(), runner_owns_engines, real_node=real_node,
            audit_log=audit_log,
        )  # fmt: skip
        self._clean_stale_state()
        self.dir.mkdir(parents=True, exist_ok=True)
        config_path = self.dir / "kwokctl.yaml"
        documents = kwokctl_documents(spec, self.binaries(), self._pki, self.audit_dir)
        if audit_log:
            self.audit_dir.mkdir()
            (self.audit_dir / "policy.yaml").write_text(yaml.safe_dump(AUDIT_POLICY))
        config_path.write_text(yaml.safe_dump_all(documents))
        self._spec_file.write_text(spec.to_json())

        step(f"starting the control plane on 127.0.0.1:{spec.port}")
        try:
            self._kwokctl(
                "create", "cluster", "--name", self.name, "--config", str(config_path),
                "--kubeconfig", "", "--wait", "120s", "--quiet-pull",
            )  # fmt: skip
            self.kubeconfig.write_text(self._kwokctl("get", "kubeconfig", "--name", self.name))
            self.kubeconfig.chmod(0o600)
            step(f"creating fake GPU nodes: {', '.join(pool.describe() for pool in chosen)}")
            self.apply_nodes(node_manifests)
            self.wait_nodes_ready([manifest["metadata"]["name"] for manifest in node_manifests])
            if real_node:
                self._start_real_node(real_node_gpus or chosen[0], list(real_node_images), step)
                self.kubectl("taint", "nodes", "--overwrite", "-l", "type=kwok",
                             "{key}={value}:{effect}".format(**FAKE_NODE_TAINT))  # fmt: skip
        except (ClusterError, subprocess.TimeoutExpired) as error:
            self.down()
            raise ClusterError(f"starting cluster {self.name!r} failed: {error}") from error
        return spec

    @property
    def _pki(self) -> Path:
        """kwokctl's certificates for this cluster (ca.crt, admin.crt, admin.key)."""
        return self._cluster_dir / "pki"

    def real_node(self) -> realnode.RealNode:
        return realnode.RealNode(self.dir, self.name, self.kubeconfig, self._pki, SERVICE_RANGE)

    def _start_real_node(self, pool: NodePool, images: list[Path], step: Step) -> None:
        node = self.real_node()
        labels = nodes.gpu_node(node.name, nodes.gpu_type(pool.gpu_type), pool.gpus_per_node)
        gpu_labels = {
            key: value
            for key, value in labels["metadata"].get("labels", {}).items()
            if key.startswith("nvidia.com/")
        }
        step(f"starting the real node {node.name} (kubelet, containerd, runc; "
             f"{pool.gpus_per_node} fake {pool.gpu_type} GPUs)")  # fmt: skip
        node.start(realnode_config.node_labels(gpu_labels), pool.gpus_per_node, images, step)

    def apply_nodes(self, manifests: list[dict[str, Any]]) -> None:
        """Create or update fake nodes; status (capacity) goes through the status subresource."""
        document = yaml.safe_dump_all(manifests)
        apply = ["apply", "--server-side", "--field-manager=llmfleet-cluster", "-f", "-"]
        self.kubectl(*apply, stdin=document)
        self.kubectl(*apply, "--subresource=status", stdin=document)

    def wait_nodes_ready(self, names: list[str], timeout: float | None = None) -> None:
        """Until kwok has made every named node Ready: by default 60 s, and 0.1 s more per node
        (kwok takes ~50 s for 1,255 nodes on two cores). One LIST a second: `kubectl wait`
        on named nodes reads them one after another, minutes for a thousand."""
        timeout = 60 + len(names) / 10 if timeout is None else timeout
        deadline = time.monotonic() + timeout
        ready_status = "{.status.conditions[?(@.type=='Ready')].status}"
        listing = "{range .items[*]}{.metadata.name}" + " " + ready_status + "{'\\n'}{end}"
        waiting = set(names)
        while True:
            for line in self.kubectl("get", "nodes", "-o", f"jsonpath={listing}").splitlines():
                name, _, status = line.partition(" ")
                if status == "True":
                    waiting.discard(name)
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"{len(waiting)} of {len(names)} nodes not Ready after "
                                   f"{timeout:.0f} s (e.g. {sorted(waiting)[0]})")  # fmt: skip
            time.sleep(1)

    def down(self) -> list[str]:
        """Stop every component and remove the cluster's state; returns what had to be killed.

        kwokctl stops what it started; anything still alive afterwards (a crash left it, or a
        pid file went missing) is terminated here, so no process and no port is left behind.
        """
        pids = self.pids()
        # The real node first: its kubelet must not watch its pods vanish with the API server.
        killed_node = self.real_node().stop() if self.dir.is_dir() else []
        if self._cluster_dir.is_dir() and build.is_built(TOOLS_BY_NAME["kwok"]):
            # On failure fall through: whatever is left is killed below.
            with contextlib.suppress(ClusterError, subprocess.TimeoutExpired):
                self._kwokctl("delete", "cluster", "--name", self.name, timeout=120)
        killed = _terminate({name: pid for name, pid in pids.items() if _alive(pid)})
        self._clean_stale_state()
        return sorted([*killed, *killed_node])

    def _clean_stale_state(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def status(self) -> ClusterStatus:
        running = self.running_components()
        api_ready = False
        node_rows: list[NodeRow] = []
        if running and self.kubeconfig.is_file():
            try:
                api_ready = self.kubectl("get", "--raw", "/readyz", timeout=10).strip() == "ok"
                listing = json.loads(self.kubectl("get", "nodes", "-o", "json", timeout=10))
                for item in listing["items"]:
                    ready = next(
                        (c["status"] for c in item["status"].get("conditions", [])
                         if c["type"] == "Ready"),
                        "Unknown",
                    )  # fmt: skip
                    gpus = item["status"].get("allocatable", {}).get(nodes.GPU_RESOURCE, "0")
                    product = item["metadata"].get("labels", {}).get(nodes.GPU_PRODUCT_LABEL)
                    gpu = nodes.gpu_type_of(product) if product else "-"
                    node_rows.append(NodeRow(item["metadata"]["name"], ready, gpu, gpus))
            except (ClusterError, subprocess.TimeoutExpired):
                api_ready = False
        return ClusterStatus(
            name=self.name,
            exists=self.dir.is_dir(),
            api_ready=api_ready,
            running_components=running,
            kubeconfig=self.kubeconfig,
            spec=self.spec(),
            nodes=tuple(node_rows),
        )


def _alive(pid: int) -> bool:
    try:
        process = psutil.Process(pid)
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _terminate(pids: dict[str, int], grace: float = 10) -> list[str]:
    for pid in pids.values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids.values()):
        time.sleep(0.1)
    for pid in pids.values():
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    # A killed process lives on until the kernel has released it (an etcd in an fsync): `down`
    # returns once its ports and files are free, not as soon as the signal is sent.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids.values()):
        time.sleep(0.1)
    return sorted(pids)
