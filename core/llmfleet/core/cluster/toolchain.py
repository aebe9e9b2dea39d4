"""Which tools the local cluster needs, pinned, and how each is obtained (pure data).

Every Go tool is built from Go modules through the Go module proxy with plain `go build` /
`go install`. Versions fit the machine's Go 1.26 toolchain (see README, "The local cluster: how
it is built and cached"; checked by the first real build). The one exception is Prometheus
(`DebTool`): Debian's package, fetched with `apt-get download` and unpacked with `dpkg-deb -x`
into the same cache, never installed (no system service, no root needed beyond
`apt-get update`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

KUBERNETES_VERSION = "v1.36.3"
ETCD_VERSION = "v3.6.16"
KWOK_VERSION = "v0.8.0"
HELM_VERSION = "v3.21.4"
INFERENCE_SIM_VERSION = "v0.10.2"
PROMETHEUS_VERSION = "2.42.0"
PROMETHEUS_DEB_VERSION = "2.42.0+ds-5+deb12u1"
"""Debian bookworm's package (security update 1): the exact version `apt-get download` fetches."""
BUSYBOX_VERSION = "1.35.0"
BUSYBOX_DEB_VERSION = "1:1.35.0-4+deb12u1+b1"
CONTAINERD_VERSION = "v2.4.2"
"""Kubernetes 1.35 was the last release to support containerd 1.x (Debian's is 1.6)."""
RUNC_VERSION = "v1.5.2"
"""The runc that containerd v2.4.2 pins."""
CNI_PLUGINS_VERSION = "v1.9.1"

GOMOD_DIR = Path(__file__).parent / "gomod"
"""Committed wrapper modules (go.mod, go.sum, tools.go) for tools that `go install` cannot build."""

# A fixed build date keeps the binaries' `--version` output the same from one build to the next.
_BUILD_DATE = "2026-01-01T00:00:00Z"


def _kubernetes_version_ldflags(version: str) -> tuple[str, ...]:
    """`-X` flags that stamp the version into component-base and client-go.

    Without them the commands report `v0.0.0-master+$Format:%H$`, which kwokctl reads as an
    unknown version and then picks the wrong flags for the components it starts.
    """
    major, minor = version.lstrip("v").split(".")[:2]
    values = {
        "gitVersion": version,
        "gitMajor": major,
        "gitMinor": minor,
        "gitTreeState": "clean",
        "gitCommit": "0" * 40,
        "buildDate": _BUILD_DATE,
    }
    flags: list[str] = []
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [f"-X {package}.{name}={value}" for name, value in values.items()]
    return tuple(flags)


@dataclass(frozen=True)
class GoTool:
    """One cached tool: the binaries one Go command builds into `<cache>/<name>-<version>/bin`."""

    name: str
    version: str
    packages: tuple[str, ...]
    """Go packages to build, one binary each (named after the package's last path element)."""
    module: str | None = None
    """Wrapper module under `gomod/` to build in; None means `go install <package>@<version>`."""
    ldflags: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    estimated_seconds: int = 120
    """Build time on a 2-core machine with nothing cached (measured; the tools are built in
    `TOOLS` order, and the later ones reuse Go packages the earlier ones compiled), shown while
    building so a long wait is expected."""
    binary_names: tuple[str, ...] = field(default=())
    """Binary names when they differ from the packages' last path elements."""
    tags: tuple[str, ...] = ()
    """Go build tags."""
    apt_build_deps: tuple[str, ...] = ()
    """Debian packages the build needs (cgo headers), installed with apt-get when missing."""

    @property
    def key(self) -> str:
        return f"{self.name}-{self.version}"

    @property
    def binaries(self) -> tuple[str, ...]:
        if self.binary_names:
            return self.binary_names
        return tuple(_binary_name(package) for package in self.packages)

    def command(self, out_dir: Path) -> tuple[list[str], Path | None, dict[str, str]]:
        """The Go command line, its working directory and extra environment for one build."""
        ldflags = " ".join(("-s", "-w", *self.ldflags))
        base = ["-trimpath", f"-ldflags={ldflags}"]
        if self.tags:
            base.append(f"-tags={','.join(self.tags)}")
        env = dict(self.env)
        if self.module is not None:
            return (
                ["go", "build", *base, "-o", f"{out_dir}/", *self.packages],
                (GOMOD_DIR / self.module),
                env,
            )
        env["GOBIN"] = str(out_dir)
        targets = [f"{package}@{self.version}" for package in self.packages]
        return ["go", "install", *base, *targets], None, env


def go_binary_name(package: str) -> str:
    """The name `go build` gives a package's binary: its last path element that is not a
    major-version suffix (`go.etcd.io/etcd/server/v3` builds `server`)."""
    parts = package.rstrip("/").split("/")
    if len(parts) > 1 and re.fullmatch(r"v[0-9]+", parts[-1]):
        return parts[-2]
    return parts[-1]


def _binary_name(package: str) -> str:
    # etcd's server package builds `server`; install it as what kwokctl and people expect.
    return "etcd" if package.startswith("go.etcd.io/etcd/server") else go_binary_name(package)


@dataclass(frozen=True)
class DebTool:
    """One cached tool taken from a Debian package: binaries unpacked into
    `<cache>/<name>-<version>/bin`, the package itself never installed."""

    name: str
    version: str
    """Upstream version; names the cache directory."""
    package: str
    package_version: str
    """Exact Debian version (`apt-get download <package>=<package_version>`)."""
    paths: tuple[str, ...]
    """Binaries inside the package, relative to its root (`usr/bin/prometheus`)."""
    estimated_seconds: int = 5
    check_args: tuple[str, ...] = ("--version",)
    """Arguments each binary must exit 0 with once fetched (it runs here)."""

    @property
    def key(self) -> str:
        return f"{self.name}-{self.version}"

    @property
    def binaries(self) -> tuple[str, ...]:
        return tuple(Path(path).name for path in self.paths)

    @property
    def pin(self) -> str:
        return f"{self.package}={self.package_version}"


Tool = GoTool | DebTool


TOOLS: tuple[Tool, ...] = (
    GoTool(
        name="kubernetes",
        version=KUBERNETES_VERSION,
        module="kubernetes",
        packages=tuple(
            f"k8s.io/kubernetes/cmd/{command}"
            for command in (
                "kube-apiserver",
                "kube-controller-manager",
                "kube-scheduler",
                "kubectl",
            )
        ),
        ldflags=_kubernetes_version_ldflags(KUBERNETES_VERSION),
        estimated_seconds=232,
    ),
    GoTool(
        name="etcd",
        version=ETCD_VERSION,
        module="etcd",
        packages=("go.etcd.io/etcd/server/v3",),
        env=(("CGO_ENABLED", "0"),),
        estimated_seconds=24,
    ),
    GoTool(
        name="kwok",
        version=KWOK_VERSION,
        packages=("sigs.k8s.io/kwok/cmd/kwok", "sigs.k8s.io/kwok/cmd/kwokctl"),
        env=(("CGO_ENABLED", "0"),),
        estimated_seconds=69,
    ),
    GoTool(
        name="helm",
        version=HELM_VERSION,
        packages=("helm.sh/helm/v3/cmd/helm",),
        ldflags=(
            f"-X helm.sh/helm/v3/internal/version.version={HELM_VERSION}",
            # Otherwise `helm template` assumes Kubernetes 1.20 for `.Capabilities`.
            "-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1",
            "-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=" + KUBERNETES_VERSION.split(".")[1],
        ),
        env=(("CGO_ENABLED", "0"),),
        estimated_seconds=67,
    ),
    GoTool(
        name="llm-d-inference-sim",
        version=INFERENCE_SIM_VERSION,
        module="inference-sim",
        packages=("github.com/llm-d/llm-d-inference-sim/cmd/llm-d-inference-sim",),
        # Pure Go since v0.8; cgo would pull in the tokenizer bindings we never use.
        env=(("CGO_ENABLED", "0"),),
        estimated_seconds=110,
    ),
    # The real node (realnode.py): kubelet and kube-proxy from the control plane's wrapper
    # module, containerd, runc and the CNI plugins it uses.
    GoTool(
        name="kubelet",
        version=KUBERNETES_VERSION,
        module="kubernetes",
        packages=tuple(f"k8s.io/kubernetes/cmd/{command}" for command in ("kubelet", "kube-proxy")),
        ldflags=_kubernetes_version_ldflags(KUBERNETES_VERSION),
        estimated_seconds=120,
    ),
    GoTool(
        name="containerd",
        version=CONTAINERD_VERSION,
        packages=tuple(
            f"github.com/containerd/containerd/v2/cmd/{command}"
            for command in ("containerd", "ctr", "containerd-shim-runc-v2")
        ),
        ldflags=(f"-X github.com/containerd/containerd/v2/version.Version={CONTAINERD_VERSION}",),
        # No snapshotters that need C libraries; overlayfs and native are built in.
        tags=("no_btrfs", "no_devmapper", "no_zfs"),
        env=(("CGO_ENABLED", "0"),),
        estimated_seconds=180,
    ),
    GoTool(
        name="runc",
        version=RUNC_VERSION,
        packages=("github.com/opencontainers/runc",),
        ldflags=(f"-X main.version={RUNC_VERSION.lstrip('v')}",),
        # seccomp (Pod Security `restricted` asks for RuntimeDefault) needs cgo and libseccomp;
        # runc's default `libpathrs` tag needs Rust, so it is left out.
        tags=("seccomp", "urfave_cli_no_docs"),
        env=(("CGO_ENABLED", "1"),),
        apt_build_deps=("libseccomp-dev",),
        estimated_seconds=30,
    ),
    GoTool(
        name="cni-plugins",
        version=CNI_PLUGINS_VERSION,
        packages=tuple(
            f"github.com/containernetworking/plugins/plugins/{plugin}"
            for plugin in ("main/bridge", "main/loopback", "ipam/host-local", "meta/portmap")
        ),
        env=(("CGO_ENABLED", "0"),),
        estimated_seconds=40,
    ),
    DebTool(
        name="prometheus",
        version=PROMETHEUS_VERSION,
        package="prometheus",
        package_version=PROMETHEUS_DEB_VERSION,
        # Go binaries linked against glibc only (>= 2.34): they run wherever bookworm's do.
        paths=("usr/bin/prometheus", "usr/bin/promtool"),
    ),
    DebTool(
        name="busybox",
        version=BUSYBOX_VERSION,
        package="busybox-static",
        package_version=BUSYBOX_DEB_VERSION,
        # Statically linked: the real node's test image (tests/cluster/test_real_node.py) is
        # this one file, which serves HTTP, runs a shell and reads its environment.
        paths=("bin/busybox",),
        check_args=("--help",),
    ),
)

TOOLS_BY_NAME = {tool.name: tool for tool in TOOLS}
