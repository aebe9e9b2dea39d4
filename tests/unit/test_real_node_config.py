"""The real node's configuration (pure): what each setting is there for is in realnode_config."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from llmfleet.core import netns
from llmfleet.core.cluster import realnode_config as config
from llmfleet.core.cluster.local import ClusterSpec, LocalCluster, kwokctl_config
from llmfleet.core.cluster.nodes import NodePool

PATHS = config.NodePaths(
    dir=Path("/state/node"),
    containerd_bin=Path("/cache/containerd/bin"),
    runc=Path("/cache/runc/bin/runc"),
    cni_bin=Path("/cache/cni/bin"),
)


def test_containerd_restricts_oom_score_adj_and_pins_the_local_sandbox() -> None:
    parsed = tomllib.loads(config.containerd_toml(PATHS))
    assert parsed["version"] == 3
    assert parsed["grpc"]["address"] == "/state/node/containerd.sock"
    runtime = parsed["plugins"]["io.containerd.cri.v1.runtime"]
    assert runtime["restrict_oom_score_adj"] is True
    runc = runtime["containerd"]["runtimes"]["runc"]
    assert runc["options"] == {"BinaryName": "/cache/runc/bin/runc", "SystemdCgroup": False}
    assert runtime["cni"] == {"bin_dirs": ["/cache/cni/bin"], "conf_dir": "/state/node/cni"}
    images = parsed["plugins"]["io.containerd.cri.v1.images"]
    assert images["pinned_images"]["sandbox"] == config.SANDBOX_IMAGE


def test_kubelet_on_cgroup_v1_with_its_own_cgroup_root_and_no_resolver() -> None:
    kubelet = config.kubelet_configuration(
        PATHS, cgroup_root="/llmfleet-x", client_ca=Path("/pki/ca.crt"), node_ip="192.0.2.200"
    )
    assert kubelet["failCgroupV1"] is False
    assert kubelet["cgroupDriver"] == "cgroupfs"
    assert kubelet["cgroupRoot"] == "/llmfleet-x"
    assert kubelet["authentication"]["anonymous"] == {"enabled": False}
    assert kubelet["containerRuntimeEndpoint"] == "unix:///state/node/containerd.sock"
    assert kubelet["resolvConf"] == "/state/node/resolv.conf"


def test_pods_get_addresses_on_a_bridge_without_masquerading() -> None:
    bridge = config.cni_conflist(PATHS)["plugins"][0]
    assert bridge["bridge"] == netns.RUN_BRIDGE == config.BRIDGE
    assert bridge["ipMasq"] is False
    assert bridge["ipam"]["ranges"] == [[{"subnet": config.POD_SUBNET}]]


def _patches(real_node: bool) -> dict[str, dict[str, str]]:
    spec = ClusterSpec("c", (NodePool("H100", 1),), 6443, real_node=real_node)
    rendered = kwokctl_config(spec, LocalCluster.binaries(), Path("/pki") if real_node else None)
    return {
        patch["name"]: {arg["key"]: arg["value"] for arg in patch["extraArgs"]}
        for patch in rendered["componentsPatches"]
    }


@pytest.mark.parametrize("real_node", [False, True], ids=["fake-only", "with-real-node"])
def test_kwok_manages_only_the_nodes_annotated_fake(real_node: bool) -> None:
    assert _patches(real_node)["kwok-controller"] == {
        "manage-all-nodes": "false",
        "cidr": "10.0.0.0/16",
        "manage-nodes-with-annotation-selector": "kwok.x-k8s.io/node=fake",
    }
    assert _patches(real_node)["kube-apiserver"]["kubelet-preferred-address-types"] == "InternalIP"


def test_only_a_real_node_opens_the_api_server_to_its_pods() -> None:
    assert "bind-address" not in _patches(False)["kube-apiserver"]
    apiserver = _patches(True)["kube-apiserver"]
    assert apiserver["bind-address"] == "0.0.0.0"
    assert apiserver["kubelet-client-certificate"] == "/pki/admin.crt"
    spec = ClusterSpec("c", (NodePool("H100", 1),), 6443, real_node=True)
    options = kwokctl_config(spec, LocalCluster.binaries(), Path("/pki"))["options"]
    sans = options["kubeApiserverCertSANs"]
    assert sans == ["10.96.0.1", netns.ADVERTISE_ADDRESS]


def _link(name: str, kind: str, master: str | None = None) -> dict[str, Any]:
    link: dict[str, Any] = {"ifname": name, "linkinfo": {"info_kind": kind}}
    if master:
        link["master"] = master
    return link


@pytest.mark.parametrize(
    ("link", "made"),
    [
        (_link("llmfleet0", "bridge"), True),
        (_link("veth1234", "veth", master="llmfleet0"), True),
        (_link("lfh0123456789", "veth"), True),
        (_link("eth0", "veth"), False),  # a veth into the host's network would be a way out
        (_link("docker0", "bridge"), False),
        (_link("llmfleet0", "veth"), False),
        ({"ifname": "ens3"}, False),
    ],
    ids=["pod-bridge", "pod-veth", "runner-veth", "other-veth", "other-bridge", "fake-name", "nic"],
)
def test_only_links_the_run_made_count_as_inside(link: dict[str, Any], made: bool) -> None:
    assert (netns.run_made([link]) == [link["ifname"]]) is made
