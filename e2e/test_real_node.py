"""llmfleet installed as a user would, on a real node (`llmfleet up --real-node`, issue 26).

The chart's operator, autoscaler and gateway are pods of the control-plane image and the engine
pods run the local engine image (the launcher with the simulator), all under a real kubelet with
containerd and runc, in namespaces that enforce Pod Security `restricted`. Driven from outside as
a user would: the official `openai` client through the relayed gateway port (the gateway pod,
behind its Service), kubectl for the rest. Fault tests count what the clients saw (answered,
failed, lost), as e2e/test_system.py does, and print the counts.
"""

from __future__ import annotations

import ipaddress
import json
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import openai
import pytest

from e2e.system import LocalSystem, wait_for
from e2e.test_system import Tally, client, stream_once, under_traffic
from llmfleet.core import images
from llmfleet.core.cluster import build
from llmfleet.core.cluster.realnode_config import POD_SUBNET, REAL_NODE_LABEL
from llmfleet.core.local import layout

pytestmark = pytest.mark.e2e

SECRET = "hf_not-a-real-token-but-a-secret"
REFUSED = re.compile(r"(?<![,.:])\b403\b|[Ff]orbidden")
"""A refusal in a component's log: HTTP 403 or "Forbidden", not the milliseconds of a log line's
timestamp (`18:19:43,403`, which failed CI once)."""
WEB = """
apiVersion: llmfleet.dev/v1alpha1
kind: InferenceService
metadata: {name: web, namespace: default}
spec:
  model: {name: org/web-model, servedName: web}
  runtime:
    gpu: {type: H100, count: 1}
    resources: {requests: {cpu: 100m, memory: 384Mi}}
    env:
      - name: HF_TOKEN
        valueFrom: {secretKeyRef: {name: web-token, key: token}}
  topology:
    unified: {replicas: 2}
"""
"""Two serving pods, no autoscaler, a gated model's token from a Secret."""
ENGINE_PROCS = (
    '$(for d in /proc/[0-9]*; do [ "$(cat $d/comm 2>/dev/null)" = llm-d-inference ] && '
    "echo ${d#/proc/}; done)"
)
"""Shell: the pids of the container's engine (the simulator; `comm` is cut at 15 characters)."""


@pytest.fixture(scope="module")
def real(system: LocalSystem) -> LocalSystem:
    """The session's system (`llmfleet up --real-node`, as `make up` starts it)."""
    assert system.on_real_node, "no real node: `llmfleet up --real-node` fell back"
    return system


@pytest.fixture(scope="module")
def web(real: LocalSystem) -> Iterator[str]:
    real.kubectl("create", "secret", "generic", "web-token", "-n", "default",
                 f"--from-literal=token={SECRET}")  # fmt: skip
    real.kubectl("apply", "-f", "-", stdin=WEB)
    wait_for(lambda: len(serving(real, "web")) == 2 or None, 120, "two serving web pods")
    real.wait_models(["web"])
    yield "web"
    # The session's system goes on to other modules: it gives back the node's GPUs it took.
    real.kubectl("delete", "inferenceservice", "web", "-n", "default", "--wait=false")
    real.kubectl("delete", "secret", "web-token", "-n", "default")


def node_name(system: LocalSystem) -> str:
    nodes = system.get("nodes", "-l", f"{REAL_NODE_LABEL}=true")["items"]
    assert len(nodes) == 1, "no real node: `llmfleet up --real-node` fell back"
    name: str = nodes[0]["metadata"]["name"]
    return name


def ready(pod: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in pod.get("status", {}).get("conditions", [])
    )


def serving(system: LocalSystem, service: str) -> list[str]:
    """The service's pods that serve and are Ready (the kubelet's readiness probe says so)."""
    return sorted(
        pod["metadata"]["name"]
        for pod in system.pods(service)
        if ready(pod) and pod["metadata"]["labels"].get("llmfleet.dev/serving") == "true"
    )


def test_every_pod_runs_on_the_real_node_from_the_built_images(real: LocalSystem) -> None:
    node = node_name(real)
    built = {image.name: image for image in images.built_images()}
    expected = {
        layout.CHART_NAMESPACE: built["control-plane"].reference,
        "default": built["engine-local"].reference,
    }
    for namespace, reference in expected.items():
        # Earlier tests' services may still be going (their pods terminating) or starting:
        # wait until every pod that is not being deleted runs.
        pods = wait_for(lambda namespace=namespace: _all_running(real, namespace), 180,
                        f"every pod in {namespace} to run")  # fmt: skip
        for pod in pods:
            name = pod["metadata"]["name"]
            assert pod["spec"]["nodeName"] == node, f"{name} is on {pod['spec']['nodeName']}"
            for container in pod["status"]["containerStatuses"]:
                assert container["image"] == reference, (name, container["image"])
        labels = real.get("namespace", namespace)["metadata"]["labels"]
        assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    for pod in real.get("pods", "-n", "default")["items"]:
        print(f"REAL NODE pod create -> Ready {pod['metadata']['name']}: {_to_ready(pod):.0f} s")


def _all_running(system: LocalSystem, namespace: str) -> list[dict[str, Any]] | None:
    """The namespace's pods that are not being deleted, once there are some and all of them
    run; None before."""
    pods = [
        pod for pod in system.get("pods", "-n", namespace)["items"]
        if not pod["metadata"].get("deletionTimestamp")
    ]  # fmt: skip
    if not pods or any(pod["status"].get("phase") != "Running" for pod in pods):
        return None
    print(system.kubectl("get", "pods", "-n", namespace, "-o", "wide"))
    return pods


def _to_ready(pod: dict[str, Any]) -> float:
    """Seconds from the pod's creation to its Ready condition (the API's 1 s resolution); the
    engine's simulated model load is 8 s of it."""
    created = datetime.fromisoformat(pod["metadata"]["creationTimestamp"])
    condition = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
    return (datetime.fromisoformat(condition["lastTransitionTime"]) - created).total_seconds()


def test_the_printed_openai_command_is_answered_by_an_engine_container(real: LocalSystem) -> None:
    command = next(line for line in real.up_output.splitlines() if "import openai" in line)
    done = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()
    with client(real) as api:
        raw = api.chat.completions.with_raw_response.create(
            model="qwen-7b", messages=[{"role": "user", "content": "Hello"}], max_tokens=8
        )
        # The gateway says which endpoint served it: an engine container on the real node.
        endpoint = raw.headers["x-llmfleet-endpoint"]
        host = endpoint.split("//", 1)[1].rsplit(":", 1)[0]
        assert ipaddress.ip_address(host) in ipaddress.ip_network(POD_SUBNET), endpoint
        assert raw.parse().choices[0].message.content
        streamed = "".join(
            chunk.choices[0].delta.content or ""
            for chunk in api.chat.completions.create(
                model="llama-8b-pd", messages=[{"role": "user", "content": "Hi"}],
                max_tokens=8, stream=True,
            )
            if chunk.choices
        )  # fmt: skip
        assert streamed
        completion = api.completions.create(model="qwen-7b", prompt="Hello", max_tokens=8)
        assert completion.choices[0].text
    print(f"served by {endpoint}")


def test_a_secret_reaches_the_engine_process_and_nothing_llmfleet_writes(
    real: LocalSystem, web: str
) -> None:
    pod = serving(real, web)[0]
    # The simulator is the launcher's child: its own environment has the Secret's value (an
    # exec'd shell would have it from the container's spec anyway: read the engine's).
    script = f'for d in {ENGINE_PROCS}; do tr "\\0" "\\n" < "/proc/$d/environ"; done'
    environ = real.kubectl("exec", "-n", "default", pod, "--", "sh", "-c", script)
    assert f"HF_TOKEN={SECRET}" in environ.splitlines()
    written = real.kubectl(
        "get", "deployments,configmaps,services,inferenceservices", "-n", "default", "-o", "json"
    )
    assert SECRET not in written
    logs = real.kubectl("logs", "-n", "default", pod)
    assert "starting engine" in logs or logs.strip(), "kubectl logs returned nothing"
    assert SECRET not in logs


def test_a_killed_engine_container_restarts_and_the_gateway_routes_around_it(
    real: LocalSystem, web: str
) -> None:
    victim, other = serving(real, web)
    restarts = _restarts(real, victim)

    def kill() -> None:
        # SIGKILL the engine inside the container: the launcher exits with it, the container
        # ends, the kubelet restarts it; meanwhile the pod is not Ready.
        real.kubectl("exec", "-n", "default", victim, "--", "sh", "-c",
                     f"kill -9 {ENGINE_PROCS}")  # fmt: skip

    tally = under_traffic(real, kill, model=web, max_tokens=32, workers=4, after=2)
    wait_for(lambda: _restarts(real, victim) > restarts or None, 60, f"{victim} restarted")
    # While it comes back, the gateway sends every request to the other pod.
    after = Tally()
    with client(real) as api:
        for _ in range(10):
            after.add(stream_once(api, web, 16))
    wait_for(lambda: victim in serving(real, web) or None, 90, f"{victim} Ready again")
    print(tally.row("engine container killed"))
    print(after.row("requests after the kill"))
    assert other in serving(real, web)
    assert tally.lost == 0
    assert after.answered == after.sent, after.row("after the kill")


def _restarts(system: LocalSystem, pod: str) -> int:
    status = system.get("pod", pod, "-n", "default")["status"]
    return sum(c["restartCount"] for c in status.get("containerStatuses", []))


def test_a_scale_down_drains_in_flight_streams(real: LocalSystem, web: str) -> None:
    wait_for(lambda: len(serving(real, web)) == 2 or None, 90, "two serving web pods")
    patch = json.dumps({"spec": {"topology": {"unified": {"replicas": 1}}}})

    def scale_down() -> None:
        real.kubectl("patch", "inferenceservice", web, "-n", "default", "--type=merge", "-p",
                     patch)  # fmt: skip

    tally = under_traffic(real, scale_down, model=web, max_tokens=200, workers=4, after=25)
    wait_for(lambda: len(real.pods(web)) == 1 or None, 90, "one web pod left")
    print(tally.row("scale-down on the real node"))
    assert tally.lost == 0
    assert sum(tally.failed.values()) == 0
    assert tally.answered > 0


def test_a_chart_upgrade_under_streaming_load_cuts_no_stream(real: LocalSystem) -> None:
    """`helm upgrade` with a changed pod annotation rolls the gateway (and the other components)
    while streams run through it: every stream finishes (the old pod keeps serving through its
    preStop delay and graceful shutdown; the Service stops sending it new connections)."""
    values = real.paths.root / "chart-values.yaml"
    old = {pod["metadata"]["name"] for pod in _gateway_pods(real)}
    stop, tally = threading.Event(), Tally()

    def work() -> None:
        with client(real, timeout=120) as api:
            while not stop.is_set():
                tally.add(stream_once(api, "qwen-7b", 100))

    threads = [threading.Thread(target=work, daemon=True) for _ in range(3)]
    for thread in threads:
        thread.start()
    time.sleep(2)
    upgraded = subprocess.run(
        [str(build.ensure_binary("helm")), "upgrade", layout.CHART_RELEASE, str(layout.CHART),
         "-n", layout.CHART_NAMESPACE, "--values", str(values), "--kubeconfig",
         str(real.paths.kubeconfig), "--set-string", "gateway.podAnnotations.rollout=2"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert upgraded.returncode == 0, upgraded.stderr
    wait_for(
        lambda: (
            (names := {p["metadata"]["name"] for p in _gateway_pods(real) if ready(p)})
            and names.isdisjoint(old)
            and len(_gateway_pods(real)) == 1
        ),
        180,
        "the new gateway pod alone",
    )
    time.sleep(3)
    stop.set()
    for thread in threads:
        thread.join(150)
        assert not thread.is_alive(), "a client hung"
    print(tally.row("chart upgrade under streaming load"))
    assert tally.lost == 0
    assert sum(tally.failed.values()) == 0
    assert tally.answered > 0
    # The old pod serves its kept-alive connections through its preStop pause: the next test
    # would reach two gateways (one whose discovery started seconds ago). Leave one, as found.
    wait_for(
        lambda: not ({p["metadata"]["name"] for p in _all_gateway_pods(real)} & old) or None,
        180,
        "the old gateway pod gone",
    )


def _all_gateway_pods(system: LocalSystem) -> list[dict[str, Any]]:
    """The gateway's pods, terminating ones included."""
    items: list[dict[str, Any]] = system.get(
        "pods", "-n", layout.CHART_NAMESPACE, "-l", "app.kubernetes.io/component=gateway"
    )["items"]
    return items


def _gateway_pods(system: LocalSystem) -> list[dict[str, Any]]:
    pods = _all_gateway_pods(system)
    return [pod for pod in pods if not pod["metadata"].get("deletionTimestamp")]


def test_the_charts_pods_work_as_their_service_accounts(real: LocalSystem) -> None:
    """The kubelet mounts each component pod's ServiceAccount token: with only the chart's RBAC
    the operator makes the samples Ready and publishes the gateway, the autoscaler (reaching
    Prometheus on the node's address) writes status.autoscaling, and no component was refused
    anything (no 403 in their logs)."""

    def ready() -> list[dict[str, Any]] | None:
        items: list[dict[str, Any]] = real.get("inferenceservices", "-n", "default")["items"]
        done = items and all(
            any(c["type"] == "Ready" and c["status"] == "True"
                for c in item.get("status", {}).get("conditions", []))
            for item in items
        )  # fmt: skip
        return items if done else None

    for service in wait_for(ready, 120, "the services Ready"):
        assert service["status"]["endpoint"] == real.gateway
    wait_for(
        lambda: (
            real.get("inferenceservice", "chat", "-n", "default")
            .get("status", {})
            .get("autoscaling", {})
            .get("pools", {})
            .get("unified", {})
            .get("reason")
            or None
        ),
        120,
        "the autoscaler pod's reason for chat's pool",
    )
    for pod in real.get("pods", "-n", layout.CHART_NAMESPACE)["items"]:
        component = pod["metadata"]["labels"]["app.kubernetes.io/component"]
        assert pod["spec"]["serviceAccountName"] == f"{layout.CHART_RELEASE}-{component}"
        logs = real.kubectl("logs", "-n", layout.CHART_NAMESPACE, pod["metadata"]["name"])
        refused = [line for line in logs.splitlines() if REFUSED.search(line)]
        assert not refused, f"{component}: {refused[:3]}"


def test_kubectl_logs_and_exec_reach_the_control_plane_pods(real: LocalSystem) -> None:
    pods = real.get("pods", "-n", layout.CHART_NAMESPACE)["items"]
    for pod in pods:
        name = pod["metadata"]["name"]
        user = real.kubectl("exec", "-n", layout.CHART_NAMESPACE, name, "--", "id", "-u").strip()
        assert user == "10001", (name, user)
        assert real.kubectl("logs", "-n", layout.CHART_NAMESPACE, name).strip(), name


BIG = """
apiVersion: llmfleet.dev/v1alpha1
kind: InferenceService
metadata: {name: big, namespace: default}
spec:
  model: {name: org/big-model, servedName: big}
  runtime: {gpu: {type: H100, count: 1}}
  topology:
    unified: {replicas: 1}
"""
"""A service with the GPU type's production requests (8 CPUs, 64 GiB): more than the real node
has, so it lands on a kwok GPU node and the pod runner runs its engine."""


def test_a_service_too_big_for_the_real_node_serves_from_a_fake_gpu_node(
    real: LocalSystem,
) -> None:
    real.kubectl("apply", "-f", "-", stdin=BIG)
    try:

        def scheduled() -> dict[str, Any] | None:
            pods = real.pods("big")  # empty until the operator made the Deployment's pod
            return pods[0] if pods and pods[0]["spec"].get("nodeName") else None

        pod = wait_for(scheduled, 60, "the big pod scheduled")
        assert pod["spec"]["nodeName"] != node_name(real)
        # The gateway pod, behind the real node's bridge, reaches the pod runner's engine.
        real.wait_models(["big"], timeout=120)

        def answered() -> str | None:
            # A new connection may reach another gateway replica than wait_models' kept-alive
            # one did, whose discovery learns the endpoint moments later: a deadline, not once.
            with client(real) as api:
                try:
                    answer = api.completions.create(model="big", prompt="Hello", max_tokens=4)
                except openai.APIStatusError:
                    return None
            return answer.choices[0].text or None

        assert wait_for(answered, 30, "an answer from big through the openai client")
    finally:
        real.kubectl("delete", "inferenceservice", "big", "-n", "default", "--wait=false")
