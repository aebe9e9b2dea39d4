"""An engine pod exactly as the operator renders it, run for real (issue 27, item 1): on the
local cluster's real node (kubelet, containerd, runc), in a namespace enforcing Pod Security
`restricted`, from the engine-local image (the launcher, with llm-d-inference-sim behind a
`vllm` shim).

What only a real kubelet shows: the pod starts as uid and gid 10001 (not group 0), its root
filesystem is read-only while the launcher and the engine find every place they write (HOME,
/tmp, the model cache, /dev/shm), the launcher turns Ready on its side port, and a gated
model's token from a Secret reaches the container while no log line carries it.

The spec differs from a GPU service only where a machine without GPUs must: the image, small
CPU/memory requests (`runtime.resources`) and a node selector for the real node.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from llmfleet.core.cluster import LocalCluster, realnode
from llmfleet.core.cluster.nodes import NodePool
from llmfleet.core.cluster.realnode_config import REAL_NODE_LABEL
from llmfleet.core.images import ensure_image
from llmfleet.crds import InferenceService
from llmfleet.operator.engine_pod import HOME_DIR, MODEL_CACHE_DIR
from llmfleet.operator.observed import Observed
from llmfleet.operator.plan import desired
from llmfleet.operator.settings import OperatorSettings
from tests.cluster.kube import Kube
from tests.net import require_isolation

pytestmark = pytest.mark.cluster

TOKEN = "hf_realNODEtokenVALUE0123456789"
NS = "engines"
UID = "00000000-0000-0000-0000-0000000000aa"


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Kube, str]]:
    require_isolation()
    assert realnode.unavailable_reason() is None, realnode.unavailable_reason()
    image = ensure_image("engine-local")
    cluster = LocalCluster("llmfleet-engine-pod", state=tmp_path_factory.mktemp("engine-node"))
    cluster.up(
        pools=[NodePool("H100", 1, 8)],
        real_node=True,
        real_node_images=[image.archive],
        step=lambda message: print(f"[real-node] {message}", file=sys.stderr),
    )
    try:
        yield cluster, Kube(cluster.kubeconfig), image.reference
    finally:
        cluster.down()


def _service(image: str) -> InferenceService:
    return InferenceService.model_validate(
        {
            "apiVersion": "llmfleet.dev/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": "gated", "namespace": NS, "uid": UID},
            "spec": {
                "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "servedName": "llama"},
                "runtime": {
                    "image": image,
                    "gpu": {"type": "H100", "count": 1},
                    "resources": {
                        "requests": {"cpu": "100m", "memory": "256Mi"},
                        # Above /dev/shm's 2Gi: the kubelet sizes a memory emptyDir at the
                        # smaller of its sizeLimit and the pod's memory limit.
                        "limits": {"memory": "3Gi"},
                    },
                    "env": [
                        {"name": "HF_TOKEN",
                         "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}},
                    ],
                },
                "topology": {"unified": {"replicas": 1, "nodeSelector": {REAL_NODE_LABEL: "true"}}},
            },
        }
    )  # fmt: skip


def _pods(kube: Kube) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kube.get("pods", "-n", NS, "-l", "llmfleet.dev/service=gated")[
        "items"
    ]
    return items


def _ready(kube: Kube) -> str | None:
    for pod in _pods(kube):
        conditions = pod.get("status", {}).get("conditions", [])
        if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
            return str(pod["metadata"]["name"])
    return None


def _python(kube: Kube, pod: str, code: str) -> Any:
    return kube.run("exec", "-n", NS, pod, "-c", "engine", "--", "python3", "-c", code)


def test_the_rendered_engine_pod_runs_restricted_on_a_real_kubelet(
    real: tuple[LocalCluster, Kube, str],
) -> None:
    _, kube, image = real
    kube.kubectl("create", "namespace", NS)
    kube.kubectl("label", "namespace", NS, "pod-security.kubernetes.io/enforce=restricted",
                 "pod-security.kubernetes.io/enforce-version=latest")  # fmt: skip
    kube.wait_for(lambda: kube.ok("get", "serviceaccount", "default", "-n", NS), 30, "the SA")
    kube.kubectl(
        "create", "secret", "generic", "hf-token", "-n", NS, f"--from-literal=token={TOKEN}"
    )
    plan = desired(_service(image), Observed(), OperatorSettings(), datetime.now(UTC))
    for child in plan.objects:
        child["metadata"].pop("ownerReferences", None)  # no InferenceService here to own them
        kube.kubectl("apply", "--server-side", "--field-manager=llmfleet-tests", "-f", "-",
                     stdin=json.dumps(child))  # fmt: skip

    def ready_or_failed() -> str | None:
        for pod in _pods(kube):
            for status in pod.get("status", {}).get("containerStatuses", []):
                if status.get("restartCount", 0) > 0:
                    logs = kube.run("logs", "-n", NS, pod["metadata"]["name"], "--previous")
                    raise AssertionError(f"the engine container restarted:\n{logs.stdout}")
        return _ready(kube)

    pod = kube.wait_for(ready_or_failed, 180, "the engine pod Ready on the real node")
    spec = kube.get("pod", pod, "-n", NS)["spec"]
    assert (
        spec["nodeName"]
        == kube.get("nodes", "-l", f"{REAL_NODE_LABEL}=true")["items"][0]["metadata"]["name"]
    )

    ids = _python(kube, pod, "import os; print(os.getuid(), os.getgid(), os.getgroups())")
    assert ids.returncode == 0, ids.stderr
    uid, gid, *_ = ids.stdout.split()
    assert (uid, gid) == ("10001", "10001"), ids.stdout

    # The root filesystem is read-only; every place the pod writes is a volume of its own.
    places = {"/": False, HOME_DIR: True, "/tmp": True, MODEL_CACHE_DIR: True, "/dev/shm": True}
    for place, writable in places.items():
        probe = _python(kube, pod, f"open('{place.rstrip('/')}/probe', 'w').write('x')")
        assert (probe.returncode == 0) == writable, f"{place}: {probe.stderr}"
        if not writable:
            assert "Read-only file system" in probe.stderr, probe.stderr
    shm = _python(
        kube, pod, "import os; s = os.statvfs('/dev/shm'); print(s.f_blocks * s.f_frsize)"
    )
    assert int(shm.stdout) == 2 * 2**30, shm.stdout  # 2 GiB for one GPU, not 64 MiB

    # The token reached the container from the Secret, and no log line carries it.
    token = _python(kube, pod, "import os; print(os.environ['HF_TOKEN'])")
    assert token.stdout.strip() == TOKEN
    logs = kube.kubectl("logs", "-n", NS, pod, "-c", "engine")
    assert "starting engine: vllm serve meta-llama/Llama-3.1-8B-Instruct" in logs, logs
    assert TOKEN not in logs
