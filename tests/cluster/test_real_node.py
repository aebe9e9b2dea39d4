"""The real node: a kubelet, containerd and runc in the local cluster, running real containers.

A cluster of its own (module scope) with one fake H100 node and the real node, whose containerd
gets a busybox image built here (`bin/busybox` from Debian's static package, in the cache): it
serves HTTP, runs a shell and reads its environment, which is what these kubelet-only paths need.
Each test waits for what another process does, with a deadline; none samples once.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmfleet.core.cluster import LocalCluster, build, pause, realnode
from llmfleet.core.cluster.nodes import NodePool
from llmfleet.core.cluster.realnode_config import POD_SUBNET, REAL_NODE_LABEL
from llmfleet.core.cluster.toolchain import TOOLS_BY_NAME
from tests.cluster.kube import Kube
from tests.net import require_isolation

pytestmark = pytest.mark.cluster

BUSYBOX = "llmfleet.local/busybox:test"
SECRET_VALUE = "s3cr3t-from-a-secret"


def busybox_archive(directory: Path) -> Path:
    binary = build.ensure_binary("busybox")
    target = directory / "busybox.oci.tar"
    files = {"bin/busybox": (binary.read_bytes(), 0o755), "www/index.html": (b"real node\n", 0o644)}
    pause.write_file_image(target, BUSYBOX, files, ["/bin/busybox"])
    return target


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Kube]]:
    require_isolation()
    assert realnode.unavailable_reason() is None, realnode.unavailable_reason()
    state = tmp_path_factory.mktemp("real-node")
    cluster = LocalCluster("llmfleet-real", state=state)
    spec = cluster.up(
        pools=[NodePool("H100", 1, 8)],
        real_node=True,
        real_node_images=[busybox_archive(state)],
        step=lambda message: print(f"[real-node] {message}", file=sys.stderr),
    )
    try:
        assert spec.real_node
        yield cluster, Kube(cluster.kubeconfig)
    finally:
        cluster.down()


def restricted_namespace(kube: Kube, name: str) -> str:
    kube.kubectl("create", "namespace", name)
    kube.kubectl(
        "label", "namespace", name, "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/enforce-version=latest",
    )  # fmt: skip
    kube.wait_for(lambda: kube.ok("get", "serviceaccount", "default", "-n", name), 30, "the SA")
    return name


def web_pod(name: str, node: str, command: str) -> dict[str, Any]:
    """A restricted-compliant busybox pod on the real node: an HTTP server behind a readiness
    probe, an env var from a Secret, a preStop hook."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 20,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 10001,
                "runAsGroup": 10001,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "web",
                    "image": BUSYBOX,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/busybox", "sh", "-c", command],
                    "env": [
                        {
                            "name": "TOKEN",
                            "valueFrom": {"secretKeyRef": {"name": "token", "key": "value"}},
                        }
                    ],
                    "readinessProbe": {
                        "httpGet": {"path": "/index.html", "port": 8080},
                        "periodSeconds": 1,
                    },
                    "lifecycle": {"preStop": {"exec": {"command": ["/bin/busybox", "sleep", "2"]}}},
                    "resources": {"limits": {"memory": "64Mi", "cpu": "200m"}},
                    # Writable, and kept across the container's restarts (the root is not).
                    "volumeMounts": [{"name": "state", "mountPath": "/state"}],
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
            "volumes": [{"name": "state", "emptyDir": {}}],
        },
    }


def start_web_pod(
    kube: Kube, cluster: LocalCluster, ns: str, name: str, command: str, *, token: str = "x"
) -> None:
    """`web_pod` in a fresh restricted namespace `ns` with its Secret; returns once Ready."""
    restricted_namespace(kube, ns)
    kube.kubectl("create", "secret", "generic", "token", "-n", ns, f"--from-literal=value={token}")
    manifest = web_pod(name, cluster.real_node().name, command)
    kube.kubectl("apply", "-n", ns, "-f", "-", stdin=json.dumps(manifest))
    kube.wait_for(lambda: ready(kube, ns, name), 60, f"pod {name} Ready on the real node")


def pod(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = kube.get("pod", name, "-n", ns)
    return found


def ready(kube: Kube, ns: str, name: str) -> bool:
    conditions = pod(kube, ns, name)["status"].get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def test_the_node_is_real_and_kwok_leaves_it_alone(real: tuple[LocalCluster, Kube]) -> None:
    cluster, kube = real
    name = cluster.real_node().name
    node = kube.get("node", name)
    info = node["status"]["nodeInfo"]
    assert info["containerRuntimeVersion"].startswith("containerd://"), info
    assert info["kubeletVersion"] == TOOLS_BY_NAME["kubelet"].version, info
    assert node["metadata"]["labels"][REAL_NODE_LABEL] == "true"
    assert "kwok.x-k8s.io/node" not in node["metadata"].get("annotations", {})
    # The fake GPUs are advertised, and the kubelet keeps them allocatable.
    kube.wait_for(
        lambda: (
            kube.get("node", name)["status"].get("allocatable", {}).get("nvidia.com/gpu") == "8"
        ),
        30,
        "8 allocatable nvidia.com/gpu on the real node",
    )
    # kwok still runs its fake node, and only that one.
    fake = [n for n in kube.get("nodes")["items"] if n["metadata"]["name"] != name]
    assert len(fake) == 1
    assert fake[0]["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"


def test_a_restricted_pod_runs_for_real(real: tuple[LocalCluster, Kube]) -> None:
    cluster, kube = real
    command = (
        'echo "token has $(echo -n $TOKEN | /bin/busybox wc -c) bytes"; '
        "exec /bin/busybox httpd -f -p 8080 -h /www"
    )
    ns = "restricted"
    start_web_pod(kube, cluster, ns, "web", command, token=SECRET_VALUE)
    node = cluster.real_node().name
    status = pod(kube, ns, "web")
    assert status["spec"]["nodeName"] == node
    assert ipaddress.ip_address(status["status"]["podIP"]) in ipaddress.ip_network(POD_SUBNET)
    # The kubelet serves logs and exec to the API server.
    logs = kube.kubectl("logs", "-n", ns, "web")
    assert f"token has {len(SECRET_VALUE)} bytes" in logs, logs
    ids = kube.kubectl("exec", "-n", ns, "web", "--", "/bin/busybox", "id")
    assert "uid=10001" in ids, ids
    assert "gid=10001" in ids, ids
    env = kube.kubectl("exec", "-n", ns, "web", "--", "/bin/busybox", "sh", "-c", "echo $TOKEN")
    assert env.strip() == SECRET_VALUE
    # The root filesystem is read-only.
    touched = kube.run("exec", "-n", ns, "web", "--", "/bin/busybox", "touch", "/x")
    assert touched.returncode != 0
    assert "Read-only file system" in touched.stderr


def test_a_killed_container_is_restarted_and_not_ready_meanwhile(
    real: tuple[LocalCluster, Kube],
) -> None:
    cluster, kube = real
    ns = "restarts"
    # The server is not the container's first process, so killing it ends the container; the
    # restarted container waits 5 s before serving, long enough to see it not Ready.
    command = (
        "if [ -e /state/started ]; then /bin/busybox sleep 5; fi; /bin/busybox touch "
        "/state/started; /bin/busybox httpd -f -p 8080 -h /www; exit 1"
    )
    start_web_pod(kube, cluster, ns, "flaky", command)
    # busybox's applets all run as `busybox`: find the server by its command line.
    kill = (
        "for d in /proc/[0-9]*; do /bin/busybox tr '\\0' ' ' < $d/cmdline | "
        "/bin/busybox grep -q '^/bin/busybox httpd ' && /bin/busybox kill ${d#/proc/}; done; true"
    )
    # When the server dies the container ends, and the runtime kills every process left in it,
    # this exec's shell included: exit 137 is then the kill working, not failing.
    result = kube.run("exec", "-n", ns, "flaky", "--", "/bin/busybox", "sh", "-c", kill)
    assert result.returncode in (0, 137), f"the kill failed: {result.stderr}"
    kube.wait_for(lambda: not ready(kube, ns, "flaky"), 30, "pod flaky not Ready after the kill")
    kube.wait_for(
        lambda: pod(kube, ns, "flaky")["status"]["containerStatuses"][0]["restartCount"] >= 1,
        60,
        "the kubelet to restart the container",
    )
    kube.wait_for(lambda: ready(kube, ns, "flaky"), 60, "pod flaky Ready again")


def test_pods_reach_the_api_server_through_the_kubernetes_service(
    real: tuple[LocalCluster, Kube],
) -> None:
    cluster, kube = real
    ns = "service"
    start_web_pod(kube, cluster, ns, "client", "exec /bin/busybox httpd -f -p 8080 -h /www")
    service_ip = kube.get("service", "kubernetes", "-n", "default")["spec"]["clusterIP"]

    def connects() -> bool:
        probe = kube.run(
            "exec", "-n", ns, "client", "--", "/bin/busybox", "sh", "-c",
            f"/bin/busybox nc -w 3 {service_ip} 443 </dev/null",
        )  # fmt: skip
        return probe.returncode == 0

    # kube-proxy programs the Service's rules after its first sync: wait for them.
    kube.wait_for(connects, 60, f"a TCP connection from the pod to {service_ip}:443", interval=1)
    token = kube.kubectl(
        "exec", "-n", ns, "client", "--", "/bin/busybox", "cat",
        "/var/run/secrets/kubernetes.io/serviceaccount/namespace",
    )  # fmt: skip
    assert token.strip() == ns


def test_down_leaves_nothing_behind(real: tuple[LocalCluster, Kube]) -> None:
    cluster, _ = real
    node = cluster.real_node()
    saved = json.loads((node.paths.dir / "kernel-settings.json").read_text())
    cluster.down()
    socket = str(node.paths.socket)
    left = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True)
    assert socket not in left.stdout
    assert str(node.paths.dir) not in left.stdout
    assert not any(
        (hierarchy / node.cgroup_root.lstrip("/")).exists()
        for hierarchy in realnode._cgroup_hierarchies()
    )
    for key in realnode.KERNEL_SETTINGS:
        assert (Path("/proc/sys") / key).read_text().strip() == saved[key], key
    assert not node.paths.dir.exists()
