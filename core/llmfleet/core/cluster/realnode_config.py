"""The real node's configuration files (pure: documents only, no I/O).

A real node is a kubelet with containerd and runc, registered to the local control plane next to
kwok's fake GPU nodes and running real containers (realnode.py starts it). Every choice below was
a failure on these machines before it was made (README.md, "The real node"):

- cgroup v1 hosts: `failCgroupV1: false`, the `cgroupfs` driver, swap tolerated;
- no CAP_SYS_RESOURCE even for root: containerd's CRI runtime restricts `oom_score_adj`;
- the kubelet changes host-wide kernel settings (`protectKernelDefaults: false`); realnode.py
  saves and restores them;
- pods live on a CNI bridge inside the run's own network namespace (`POD_SUBNET`, a benchmarking
  range that exists nowhere else), with no masquerading and no port maps: no iptables rules but
  kube-proxy's own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

POD_SUBNET = "198.18.0.0/24"
"""Pod IPs of the real node (RFC 2544's benchmarking range; only inside the run's namespace)."""

BRIDGE = "llmfleet0"
SANDBOX_IMAGE = "llmfleet.local/pause:1"
"""The pod sandbox image: built locally (pause.py), imported, pinned so it is never collected."""

REAL_NODE_LABEL = "llmfleet.dev/real-node"
"""Set to "true" on the real node: a pod that must run for real selects it."""


@dataclass(frozen=True)
class NodePaths:
    """Where one real node keeps its files; `dir` is on disk under the cluster's state."""

    dir: Path
    containerd_bin: Path
    runc: Path
    cni_bin: Path

    @property
    def socket(self) -> Path:
        """containerd's socket, outside the node's private mounts so `ctr` reaches it."""
        return self.dir / "containerd.sock"

    @property
    def containerd_config(self) -> Path:
        return self.dir / "containerd.toml"

    @property
    def kubelet_config(self) -> Path:
        return self.dir / "kubelet.yaml"

    @property
    def kube_proxy_config(self) -> Path:
        return self.dir / "kube-proxy.yaml"

    @property
    def cni_conf_dir(self) -> Path:
        return self.dir / "cni"

    @property
    def resolv_conf(self) -> Path:
        return self.dir / "resolv.conf"

    @property
    def logs(self) -> Path:
        return self.dir / "logs"


def containerd_toml(paths: NodePaths) -> str:
    """containerd 2.x (config version 3): CRI with runc through cgroupfs, our CNI, a pinned
    local sandbox image. Its root and state are the defaults, on the private tmpfs mounts."""
    runtime = "plugins.'io.containerd.cri.v1.runtime'"
    return "\n".join(
        [
            "version = 3",
            "",
            "[grpc]",
            f"  address = {json.dumps(str(paths.socket))}",
            "",
            f"[{runtime}]",
            "  enable_selinux = false",
            # NOTE: root here lacks CAP_SYS_RESOURCE, so runc cannot lower a process's
            # oom_score_adj below its parent's: without this every sandbox fails to start.
            "  restrict_oom_score_adj = true",
            "",
            f"[{runtime}.containerd]",
            "  default_runtime_name = 'runc'",
            "",
            f"[{runtime}.containerd.runtimes.runc]",
            "  runtime_type = 'io.containerd.runc.v2'",
            "",
            f"[{runtime}.containerd.runtimes.runc.options]",
            f"  BinaryName = {json.dumps(str(paths.runc))}",
            "  SystemdCgroup = false",
            "",
            f"[{runtime}.cni]",
            f"  bin_dirs = [{json.dumps(str(paths.cni_bin))}]",
            f"  conf_dir = {json.dumps(str(paths.cni_conf_dir))}",
            "",
            "[plugins.'io.containerd.cri.v1.images']",
            "  snapshotter = 'overlayfs'",
            "",
            "[plugins.'io.containerd.cri.v1.images'.pinned_images]",
            f"  sandbox = {json.dumps(SANDBOX_IMAGE)}",
            "",
        ]
    )


def cni_conflist(paths: NodePaths) -> dict[str, Any]:
    """One bridge, host-local addresses from `POD_SUBNET`, the bridge as the pods' gateway."""
    return {
        "cniVersion": "1.0.0",
        "name": "llmfleet",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(paths.dir / "cni-ipam"),
                },
            },
        ],
    }


def kubelet_configuration(
    paths: NodePaths, *, cgroup_root: str, client_ca: Path, node_ip: str
) -> dict[str, Any]:
    """The KubeletConfiguration. The API server authenticates to it with the cluster's client
    certificate (logs, exec), so anonymous access stays off."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": node_ip,
        "healthzBindAddress": "127.0.0.1",
        "readOnlyPort": 0,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(client_ca)},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{paths.socket}",
        "cgroupDriver": "cgroupfs",
        # Pods' cgroups under a root of this node's own, so two nodes (two test sessions) never
        # share `kubepods` and teardown removes exactly what this node made.
        "cgroupRoot": cgroup_root,
        "failCgroupV1": False,
        "failSwapOn": False,
        "protectKernelDefaults": False,
        "resolvConf": str(paths.resolv_conf),
        "serializeImagePulls": False,
        # A shared, noisy development machine: evict only when really short.
        "evictionHard": {
            "memory.available": "200Mi",
            "nodefs.available": "2%",
            "imagefs.available": "2%",
        },
        "imageGCHighThresholdPercent": 99,
        "imageGCLowThresholdPercent": 98,
        "nodeStatusReportFrequency": "10s",
        "shutdownGracePeriod": "0s",
    }


def kube_proxy_configuration(kubeconfig: Path, node_name: str) -> dict[str, Any]:
    """kube-proxy in iptables mode, touching no host-wide conntrack setting."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": node_name,
        "mode": "iptables",
        "clusterCIDR": POD_SUBNET,
        "metricsBindAddress": "127.0.0.1:10249",
        "healthzBindAddress": "127.0.0.1:10256",
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
    }


def node_labels(gpu_labels: dict[str, str]) -> dict[str, str]:
    """The real node's labels: ours, plus the GPU labels of the type it pretends to carry."""
    return {REAL_NODE_LABEL: "true", **gpu_labels}
