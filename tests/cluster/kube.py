"""A small test helper around our kubectl and the Kubernetes Python client for one kubeconfig."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client, config

from llmfleet.core.cluster import build
from llmfleet.core.cluster.toolchain import TOOLS_BY_NAME
from llmfleet.crds import render

T = TypeVar("T")


class Kube:
    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        ours = build.binary(TOOLS_BY_NAME["kubernetes"], "kubectl")
        self.kubectl_path = str(ours) if ours.exists() else (shutil.which("kubectl") or "kubectl")

    def run(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.kubectl_path, "--kubeconfig", str(self.kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        result = self.run(*args, stdin=stdin)
        assert result.returncode == 0, f"kubectl {' '.join(args)} failed: {result.stderr}"
        return result.stdout

    def ok(self, *args: str) -> bool:
        return self.run(*args).returncode == 0

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def api(self) -> client.ApiClient:
        return config.new_client_from_config(config_file=str(self.kubeconfig))

    @staticmethod
    def wait_for(check: Callable[[], T], timeout: float, what: str, interval: float = 0.2) -> T:
        """Poll `check` until it returns something truthy; fail naming `what` at the deadline."""
        deadline = time.monotonic() + timeout
        last: T = check()
        while not last:
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(interval)
            last = check()
        return last


# InferenceService helpers shared by the operator and autoscaler tests.


def install_crds(kube: Kube) -> None:
    """Apply the project's CRDs (InferenceService, kopf's peerings) and wait until they serve."""
    for manifest in sorted(render.MANIFESTS_DIR.glob("*.yaml")):
        kube.kubectl(
            "apply", "--server-side", "--field-manager=llmfleet-tests", "-f", str(manifest)
        )
    kube.kubectl("wait", "--for=condition=Established", "--timeout=30s", f"crd/{render.CRD_NAME}")


def condition(kube: Kube, ns: str, name: str, kind: str = "Ready") -> dict[str, Any]:
    status = kube.get(f"inferenceservices.llmfleet.dev/{name}", "-n", ns).get("status", {})
    found = [c for c in status.get("conditions", []) if c["type"] == kind]
    return found[0] if found else {}


def wait_ready(kube: Kube, ns: str, name: str, timeout: float = 90) -> None:
    kube.wait_for(lambda: condition(kube, ns, name).get("status") == "True", timeout,
                  f"{ns}/{name} Ready=True (now {condition(kube, ns, name)})")  # fmt: skip


def serving_endpoints(kube: Kube, ns: str, service: str) -> list[str]:
    slices = kube.get("endpointslices", "-n", ns, "-l", f"kubernetes.io/service-name={service}")
    return sorted(
        endpoint["targetRef"]["name"]
        for item in slices["items"]
        for endpoint in item.get("endpoints") or []
        if endpoint.get("conditions", {}).get("ready")
    )


def wait_endpoints(kube: Kube, ns: str, service: str, count: int, timeout: float = 30) -> list[str]:
    """Wait until `service`'s EndpointSlices hold exactly `count` ready endpoints.

    The EndpointSlice controller follows pod readiness asynchronously, so an InferenceService can
    be Ready (its pods are) a moment before the slices say so; tests wait rather than assert."""

    found: list[str] = []

    def exactly() -> bool:  # True, not the list: an empty list would read as "not yet"
        found[:] = serving_endpoints(kube, ns, service)
        return len(found) == count

    kube.wait_for(exactly, timeout, f"{count} ready endpoint(s) of {ns}/{service}")
    return found
