"""The session's local cluster: started once (or taken from LLMFLEET_KUBECONFIG) and torn down.

Every test module here sets `pytestmark = pytest.mark.cluster`. The cluster runs inside the
test run's loopback-only network namespace (`llmfleet isolated`; outside one the fixture fails
with the reason); its binaries are built before, outside (`make test` does), and a build still
running elsewhere is waited for, so a cold cache costs time, never a skip.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmfleet.core.cluster import LocalCluster
from llmfleet.crds import render
from tests.cluster.kube import Kube
from tests.cluster.operator_process import OperatorProcess
from tests.net import require_isolation

CLUSTER_NAME = "llmfleet-test"


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kube]:
    require_isolation()
    configured = os.environ.get("LLMFLEET_KUBECONFIG")
    if configured:
        yield Kube(Path(configured))
        return
    cluster = LocalCluster(CLUSTER_NAME, state=tmp_path_factory.mktemp("cluster-state"))
    started = time.monotonic()
    # The default node pools (2 x H100, 1 x H200, 8 GPUs each): every sample runs on them.
    cluster.up(step=lambda message: print(f"[cluster] {message}", file=sys.stderr))
    print(f"[cluster] ready in {time.monotonic() - started:.1f}s", file=sys.stderr)
    try:
        yield Kube(cluster.kubeconfig)
    finally:
        cluster.down()


@pytest.fixture
def namespace(kube: Kube, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards; waits so its pods free their GPUs."""
    name = f"t-{request.node.name[:40].lower().replace('_', '-').strip('-')}-{os.getpid() % 10000}"
    name = "".join(ch for ch in name if ch.isalnum() or ch == "-")
    kube.kubectl("create", "namespace", name)
    kube.wait_for(
        lambda: kube.ok("get", "serviceaccount", "default", "-n", name),
        30,
        f"the default ServiceAccount in {name}",
    )
    try:
        yield name
    finally:
        kube.kubectl("delete", "namespace", name, "--timeout=90s")


# -- one operator for one test module's namespace (the autoscaler's cluster tests) ----------------


@pytest.fixture
def namespace_operator(
    kube: Kube, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[OperatorProcess]:
    """The CRDs installed, then `llmfleet operator --standalone` for the test module's
    `NAMESPACE` (with its `OPERATOR_ENV`, if any); its log's tail is printed when it stops."""
    for manifest in sorted(render.MANIFESTS_DIR.glob("*.yaml")):
        kube.kubectl(
            "apply", "--server-side", "--field-manager=llmfleet-tests", "-f", str(manifest)
        )
    kube.kubectl("wait", "--for=condition=Established", "--timeout=30s", f"crd/{render.CRD_NAME}")
    process = OperatorProcess(
        kube, tmp_path / "operator.log", "--standalone", "-n", request.module.NAMESPACE,
        env=dict(getattr(request.module, "OPERATOR_ENV", {})),
    )  # fmt: skip
    yield process
    process.stop()
    print(f"--- operator log (tail)\n{process.text()[-3000:]}")


@pytest.fixture
def operator_namespace(
    kube: Kube, namespace_operator: OperatorProcess, request: pytest.FixtureRequest
) -> Iterator[str]:
    """The module's NAMESPACE, created after the operator started watching its exact name."""
    name: str = request.module.NAMESPACE
    kube.kubectl("create", "namespace", name)
    yield name
    kube.kubectl("delete", "namespace", name, "--timeout=120s")
