"""The pinned toolchain: wrapper modules match their versions and builds stamp versions in."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llmfleet.core.cluster.toolchain import (
    GOMOD_DIR,
    KUBERNETES_VERSION,
    TOOLS,
    TOOLS_BY_NAME,
    DebTool,
    GoTool,
    go_binary_name,
)


def test_kubernetes_wrapper_replaces_every_staging_module_at_the_matching_version() -> None:
    go_mod = (GOMOD_DIR / "kubernetes" / "go.mod").read_text()
    assert f"require k8s.io/kubernetes {KUBERNETES_VERSION}" in go_mod
    staging = "v0." + KUBERNETES_VERSION.split(".", 1)[1]
    replaces = re.findall(r"^\s*(k8s\.io/\S+) => (k8s\.io/\S+) (\S+)$", go_mod, re.MULTILINE)
    assert len(replaces) >= 30
    for source, target, version in replaces:
        assert source == target
        assert version == staging, f"{source} pinned at {version}, expected {staging}"


def test_every_wrapper_module_has_a_checksum_file_and_tools_go() -> None:
    for tool in TOOLS:
        if not isinstance(tool, GoTool) or tool.module is None:
            continue
        module = GOMOD_DIR / tool.module
        assert (module / "go.sum").stat().st_size > 0
        tools_go = (module / "tools.go").read_text()
        for package in tool.packages:
            assert f'"{package}"' in tools_go


def test_kubernetes_build_stamps_its_version_for_kwokctl() -> None:
    argv, cwd, _ = TOOLS_BY_NAME["kubernetes"].command(Path("/out"))
    assert argv[:2] == ["go", "build"]
    assert cwd == GOMOD_DIR / "kubernetes"
    ldflags = next(arg for arg in argv if arg.startswith("-ldflags="))
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        assert f"-X {package}.gitVersion={KUBERNETES_VERSION}" in ldflags
        assert f"-X {package}.gitMinor=36" in ldflags


def test_plain_modules_are_go_installed_at_their_version_into_the_cache() -> None:
    argv, cwd, env = TOOLS_BY_NAME["kwok"].command(Path("/cache/kwok/bin"))
    assert argv[:2] == ["go", "install"]
    assert cwd is None
    assert env["GOBIN"] == "/cache/kwok/bin"
    assert "sigs.k8s.io/kwok/cmd/kwokctl@v0.8.0" in argv


@pytest.mark.parametrize(
    ("package", "binary"),
    [
        ("k8s.io/kubernetes/cmd/kubectl", "kubectl"),
        ("go.etcd.io/etcd/server/v3", "server"),
        ("helm.sh/helm/v3/cmd/helm", "helm"),
    ],
)
def test_go_binary_names_follow_go_build(package: str, binary: str) -> None:
    assert go_binary_name(package) == binary


def test_tool_binaries() -> None:
    assert TOOLS_BY_NAME["etcd"].binaries == ("etcd",)
    assert TOOLS_BY_NAME["kubernetes"].binaries == (
        "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl",
    )  # fmt: skip


def test_prometheus_is_debian_bookworms_package_unpacked_into_the_cache() -> None:
    tool = TOOLS_BY_NAME["prometheus"]
    assert isinstance(tool, DebTool)
    assert tool.key == "prometheus-2.42.0"
    assert tool.pin == "prometheus=2.42.0+ds-5+deb12u1"
    assert tool.binaries == ("prometheus", "promtool")


def test_the_real_node_tools_are_pinned_with_their_build_needs() -> None:
    assert TOOLS_BY_NAME["kubelet"].binaries == ("kubelet", "kube-proxy")
    assert TOOLS_BY_NAME["kubelet"].version == KUBERNETES_VERSION
    containerd = TOOLS_BY_NAME["containerd"]
    assert isinstance(containerd, GoTool)
    assert containerd.binaries == ("containerd", "ctr", "containerd-shim-runc-v2")
    argv, _, env = containerd.command(Path("/out"))
    assert "-tags=no_btrfs,no_devmapper,no_zfs" in argv
    assert env["CGO_ENABLED"] == "0"
    runc = TOOLS_BY_NAME["runc"]
    assert isinstance(runc, GoTool)
    argv, _, env = runc.command(Path("/out"))
    # seccomp (Pod Security `restricted`) needs cgo and libseccomp's headers, installed by apt.
    assert "-tags=seccomp,urfave_cli_no_docs" in argv
    assert env["CGO_ENABLED"] == "1"
    assert runc.apt_build_deps == ("libseccomp-dev",)
    busybox = TOOLS_BY_NAME["busybox"]
    assert isinstance(busybox, DebTool)
    assert busybox.check_args == ("--help",)  # busybox has no --version
