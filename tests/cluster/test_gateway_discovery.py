"""The gateway's Kubernetes discovery follows the operator on the real local cluster.

No request reaches the endpoints: kwok's pod IPs are fake and off loopback, and the gateway runs
with LLMFLEET_LOOPBACK_ONLY on, which refuses them before connecting (test_loopback_only.py
watches that from outside the process). What is checked is the endpoint set the gateway would
route to, as pools scale and pods are promoted and demoted.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llmfleet.crds import render
from llmfleet.gateway.kube_discovery import KubeDiscovery, kubernetes_lister
from tests.cluster.kube import Kube
from tests.cluster.operator_process import CliProcess, OperatorProcess
from tests.crds.cases import SAMPLES_DIR
from tests.net import free_port

pytestmark = pytest.mark.cluster
MODEL = "Qwen/Qwen2.5-7B-Instruct"  # spares.yaml's served name


@pytest.fixture
def ns(kube: Kube, tmp_path: Path) -> Iterator[str]:
    name = f"discovery-{os.getpid() % 10000}"
    for manifest in sorted(render.MANIFESTS_DIR.glob("*.yaml")):
        kube.kubectl(
            "apply", "--server-side", "--field-manager=llmfleet-tests", "-f", str(manifest)
        )
    kube.kubectl("create", "namespace", name)
    operator = OperatorProcess(kube, tmp_path / "operator.log", "--standalone", "-n", name)
    try:
        yield name
    finally:
        kube.kubectl("delete", "namespace", name, "--timeout=120s")
        operator.stop()


def scale(kube: Kube, ns: str, replicas: int) -> None:
    patch = f'{{"spec":{{"topology":{{"unified":{{"replicas":{replicas}}}}}}}}}'
    kube.kubectl("patch", "inferenceservices.llmfleet.dev/qwen-7b-spares", "-n", ns,
                 "--type=merge", "-p", patch)  # fmt: skip


def test_endpoint_set_follows_scaling_and_demotion(kube: Kube, ns: str) -> None:
    kube.kubectl("apply", "--server-side", "-n", ns, "-f", str(SAMPLES_DIR / "spares.yaml"))

    async def scenario() -> None:
        discovery = KubeDiscovery(kubernetes_lister(str(kube.kubeconfig), ns), interval=0.5)
        await discovery.start()

        async def endpoints_become(count: int, timeout: float) -> tuple[str, ...]:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                service = discovery.services().get(MODEL)
                if service is not None and len(service.pools["unified"].endpoints) == count:
                    return service.pools["unified"].endpoints
                await asyncio.sleep(0.1)
            now = discovery.services().get(MODEL)
            raise AssertionError(f"endpoints never became {count}: {now}")

        try:
            first = await endpoints_become(1, 90)  # one serving pod; the spare is left out
            assert discovery.ready()

            started = time.monotonic()
            scale(kube, ns, 2)
            both = await endpoints_become(2, 30)
            print(f"gateway saw the promoted spare after {time.monotonic() - started:.2f}s")
            assert set(first) < set(both)

            started = time.monotonic()
            scale(kube, ns, 1)
            remaining = await endpoints_become(1, 30)
            print(f"gateway dropped the demoted pod after {time.monotonic() - started:.2f}s")
            assert set(remaining) < set(both)
        finally:
            await discovery.stop()

    asyncio.run(scenario())


class Gateway(CliProcess):
    """`llmfleet gateway` as a process on a free 127.0.0.1 port (optionally under strace)."""

    stop_signal = signal.SIGTERM

    def __init__(self, log: Path, *args: str, trace: Path | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        address = ("--host", "127.0.0.1", "--port", str(self.port))
        super().__init__(log, "gateway", *args, *address, env={}, trace=trace)

    def models(self, key: str | None = None) -> list[str]:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        try:
            reply = httpx.get(f"{self.url}/v1/models", headers=headers, timeout=2)
        except httpx.TransportError:
            return []
        return [m["id"] for m in reply.json().get("data", [])] if reply.is_success else []

    def ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False


def test_gateway_serves_the_discovered_models(kube: Kube, ns: str, tmp_path: Path) -> None:
    """`llmfleet gateway --kubeconfig` lists what the operator serves (no engine is called)."""
    kube.kubectl("apply", "--server-side", "-n", ns, "-f", str(SAMPLES_DIR / "unified.yaml"))
    gateway = Gateway(tmp_path / "gateway.log", "--kubeconfig", str(kube.kubeconfig),
                      "--namespace", ns)  # fmt: skip
    try:
        assert "meta-llama/Llama-3.1-8B-Instruct" in kube.wait_for(
            gateway.models, 60, f"the gateway to list the model ({tmp_path / 'gateway.log'})"
        )
        # /readyz follows: after discovery, the gateway makes the fleet's routing state
        # (`app.Warmed`), so it may still answer 503 when the models are first listed
        kube.wait_for(gateway.ready, 30, "the gateway's /readyz to answer 200")
    finally:
        gateway.stop()


def test_api_keys_come_from_a_kubernetes_secret(kube: Kube, ns: str, tmp_path: Path) -> None:
    tenants = "tenants:\n  team-a:\n    keys: [sk-team-a]\n    requestsPerMinute: 60\n"
    kube.kubectl("create", "secret", "generic", "gateway-keys", "-n", ns,
                 f"--from-literal=tenants.yaml={tenants}")  # fmt: skip
    gateway = Gateway(tmp_path / "gateway.log", "--kubeconfig", str(kube.kubeconfig),
                      "--namespace", ns, "--api-keys-secret", f"{ns}/gateway-keys")  # fmt: skip
    try:
        kube.wait_for(gateway.ready, 60, "the gateway to be ready")
        # The model does not exist: with the key the request passes auth and gets a 404; it
        # never reaches an engine. Without the key: 401.
        body = {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}
        url = f"{gateway.url}/v1/chat/completions"
        without = httpx.post(url, json=body, timeout=5)
        wrong = httpx.post(url, json=body, headers={"Authorization": "Bearer nope"}, timeout=5)
        right = httpx.post(url, json=body, headers={"Authorization": "Bearer sk-team-a"},
                           timeout=5)  # fmt: skip
        assert (without.status_code, wrong.status_code, right.status_code) == (401, 401, 404)
        assert without.json()["error"]["code"] == "invalid_api_key"
    finally:
        gateway.stop()

    missing = subprocess.run(
        [sys.executable, "-m", "llmfleet.core.cli", "gateway", "--kubeconfig",
         str(kube.kubeconfig), "--api-keys-secret", f"{ns}/absent"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert missing.returncode == 1
    assert f"cannot read Secret {ns}/absent" in missing.stderr
    assert "Traceback" not in missing.stderr
