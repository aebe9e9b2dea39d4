"""Network isolation on the real API server (issue 17): the operator's NetworkPolicy per service,
read back from the API server, admits exactly the gateway, Prometheus and operator pods (the
operator's in-flight probe of draining engines, issue 27), and, when
Disaggregated, the service's own prefill and decode pods; it goes with its service and when
switched off; `status.endpoint` is never a pool Service.

Which pods a peer admits is asked of the API server itself: its namespace selector and pod
selector are run as label queries against real namespaces and pods (decoys included). The local
cluster has no CNI plugin, so nothing here enforces the policy's traffic rules: these tests
show what the policy selects, as the API server stores it, not packets being dropped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmfleet.crds import labels as L
from tests.cluster.kube import Kube, condition, install_crds, wait_ready
from tests.cluster.operator_process import OperatorProcess

pytestmark = pytest.mark.cluster

SUFFIX = os.getpid() % 10000
NAMESPACE = f"isolation-{SUFFIX}"
GATEWAY_NS = f"isolation-gw-{SUFFIX}"
MONITORING_NS = f"isolation-mon-{SUFFIX}"
GATEWAY_LABELS = {"app.kubernetes.io/name": "llmfleet", "app.kubernetes.io/component": "gateway"}
PROMETHEUS_LABELS = {"app.kubernetes.io/name": "prometheus", "team": "sre"}
OPERATOR_LABELS = {"app.kubernetes.io/name": "llmfleet", "app.kubernetes.io/component": "operator"}
OPERATOR_ENV = {
    "LLMFLEET_OPERATOR_GATEWAY_NAMESPACE": GATEWAY_NS,
    # The operator runs beside the gateway, as the chart installs them.
    "LLMFLEET_OPERATOR_OPERATOR_NAMESPACE": GATEWAY_NS,
    "LLMFLEET_OPERATOR_PROMETHEUS_NAMESPACE": MONITORING_NS,
    "LLMFLEET_OPERATOR_PROMETHEUS_POD_LABELS": json.dumps(PROMETHEUS_LABELS),
    "LLMFLEET_OPERATOR_GATEWAY_URL": "",
}
"""The gateway's pod labels are left at their default, Prometheus's set (JSON, as a chart
would), and no gateway URL is given."""


def create_namespace(kube: Kube, name: str) -> None:
    kube.kubectl("create", "namespace", name)
    kube.wait_for(lambda: kube.ok("get", "serviceaccount", "default", "-n", name), 30,
                  f"the default ServiceAccount in {name}")  # fmt: skip


def plain_pod(kube: Kube, ns: str, name: str, labels: dict[str, str]) -> None:
    """A pod that only carries labels (what a peer selects); whether it runs does not matter."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
           "spec": {"containers": [{"name": "c", "image": "registry.invalid/none"}]}}  # fmt: skip
    kube.kubectl("create", "-n", ns, "-f", "-", stdin=json.dumps(pod))


@pytest.fixture
def ns(kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The services' namespace, a gateway namespace and a monitoring namespace, with pods that
    a peer must admit and decoys it must not; yields the namespace and a folder for logs."""
    install_crds(kube)
    for name in (NAMESPACE, GATEWAY_NS, MONITORING_NS):
        create_namespace(kube, name)
    try:
        plain_pod(kube, GATEWAY_NS, "gateway", GATEWAY_LABELS)
        plain_pod(kube, MONITORING_NS, "prometheus", PROMETHEUS_LABELS)
        plain_pod(kube, GATEWAY_NS, "operator", OPERATOR_LABELS)
        # Decoys: gateway-, operator- and Prometheus-labelled pods in the wrong namespaces; a
        # Prometheus missing one of its labels.
        plain_pod(kube, MONITORING_NS, "operator-elsewhere", OPERATOR_LABELS)
        plain_pod(kube, NAMESPACE, "gateway-elsewhere", GATEWAY_LABELS)
        plain_pod(kube, GATEWAY_NS, "prometheus-elsewhere", PROMETHEUS_LABELS)
        plain_pod(kube, MONITORING_NS, "prometheus-other-team",
                  {"app.kubernetes.io/name": "prometheus"})  # fmt: skip
        yield NAMESPACE, tmp_path_factory.mktemp("operator")
    finally:
        for name in (NAMESPACE, GATEWAY_NS, MONITORING_NS):
            kube.kubectl("delete", "namespace", name, "--timeout=120s")


def selector_text(selector: dict[str, Any]) -> str:
    """A LabelSelector as kubectl's `-l` text (matchLabels, and matchExpressions with In)."""
    terms = [f"{key}={value}" for key, value in selector.get("matchLabels", {}).items()]
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "In", expression
        terms.append(f"{expression['key']} in ({','.join(expression['values'])})")
    return ",".join(terms)


def admitted(kube: Kube, peer: dict[str, Any], policy_ns: str) -> set[str]:
    """`namespace/pod` of every pod the peer selects, by the API server's label queries: no
    namespaceSelector is the policy's own namespace, an empty one every namespace."""
    if "namespaceSelector" not in peer:
        namespaces = [policy_ns]
    else:
        query = selector_text(peer["namespaceSelector"])
        found = kube.get("namespaces", *(["-l", query] if query else []))["items"]
        namespaces = [item["metadata"]["name"] for item in found]
    pods = set()
    for namespace in namespaces:
        selected = kube.get("pods", "-n", namespace, "-l", selector_text(peer["podSelector"]))
        pods |= {f"{namespace}/{item['metadata']['name']}" for item in selected["items"]}
    return pods


def engine_pods(kube: Kube, ns: str, name: str, pools: tuple[str, ...]) -> set[str]:
    found = kube.get("pods", "-n", ns, "-l", f"{L.SERVICE}={name}")["items"]
    return {
        f"{ns}/{p['metadata']['name']}" for p in found if p["metadata"]["labels"][L.POOL] in pools
    }


def network_policy(kube: Kube, ns: str, name: str) -> dict[str, Any] | None:
    result = kube.run("get", "networkpolicy", f"{name}-engines", "-n", ns, "-o", "json")
    if result.returncode != 0:
        assert "NotFound" in result.stderr, result.stderr
        return None
    found: dict[str, Any] = json.loads(result.stdout)
    return found


def sources(kube: Kube, policy: dict[str, Any]) -> list[tuple[set[str], list[Any] | None]]:
    """Each ingress peer as the pods it admits, with the ports they may reach (None: all)."""
    ns = policy["metadata"]["namespace"]
    return [
        (admitted(kube, peer, ns), rule.get("ports"))
        for rule in policy["spec"]["ingress"]
        for peer in rule["from"]
    ]


def service(name: str, topology: dict[str, Any]) -> str:
    return json.dumps({
        "apiVersion": "llmfleet.dev/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {"model": {"name": "org/m"}, "runtime": {"gpu": {"type": "H100", "count": 1}},
                 "topology": topology},
    })  # fmt: skip


UNIFIED = {"mode": "Unified", "unified": {"replicas": 1}}
DISAGGREGATED = {"mode": "Disaggregated", "unified": None,
                 "prefill": {"replicas": 1}, "decode": {"replicas": 1},
                 "kvTransfer": {"connector": "NixlConnector"}}  # fmt: skip
ENGINE_PORT = [{"port": L.ENGINE_PORT, "protocol": "TCP"}]
GATEWAY = {f"{GATEWAY_NS}/gateway"}
PROMETHEUS = {f"{MONITORING_NS}/prometheus"}
OPERATOR = {f"{GATEWAY_NS}/operator"}
ADMITTED = [(GATEWAY, ENGINE_PORT), (PROMETHEUS, ENGINE_PORT), (OPERATOR, ENGINE_PORT)]


def no_endpoint_is_published(kube: Kube, namespace: str, name: str) -> None:
    """Without a gateway URL: no endpoint (never a pool Service), and a condition saying why."""
    path = f"inferenceservices.llmfleet.dev/{name}"

    def endpoint() -> str:
        return str(kube.get(path, "-n", namespace)["status"].get("endpoint", ""))

    assert endpoint() == "", "the schema defaults a removed endpoint to ''"
    published = condition(kube, namespace, name, "EndpointPublished")
    assert (published["status"], published["reason"]) == ("False", "NoGatewayURL")
    # A pool Service address an older operator wrote is taken back on the next pass.
    stale = json.dumps({"status": {"endpoint": f"http://{name}-unified.{namespace}.svc:8000"}})
    kube.kubectl("patch", path, "-n", namespace, "--subresource=status", "--type=merge",
                 "-p", stale)  # fmt: skip
    kube.wait_for(lambda: endpoint() == "", 30, "the pool Service address removed", 1)


def test_the_network_policy_admits_exactly_the_gateway_prometheus_and_the_operator(
    kube: Kube, ns: tuple[str, Path]
) -> None:
    namespace, logs = ns
    operator = OperatorProcess(kube, logs / "operator.log", "--standalone", "-n", namespace,
                               env=OPERATOR_ENV)  # fmt: skip
    try:
        for name in ("chat", "other"):
            kube.kubectl("create", "-n", namespace, "-f", "-", stdin=service(name, UNIFIED))
        for name in ("chat", "other"):
            wait_ready(kube, namespace, name)

        policy = kube.wait_for(lambda: network_policy(kube, namespace, "chat"), 30, "the policy")
        assert policy is not None
        print(json.dumps(policy["spec"], indent=1))
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        assert sources(kube, policy) == ADMITTED
        protected = admitted(kube, {"podSelector": policy["spec"]["podSelector"]}, namespace)
        assert protected == engine_pods(kube, namespace, "chat", ("unified",))
        owner = policy["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["controller"]) == (
            "InferenceService",
            "chat",
            True,
        )

        no_endpoint_is_published(kube, namespace, "chat")

        # Disaggregated: the prefill and decode pods of this service also reach each other.
        patch = json.dumps({"spec": {"topology": DISAGGREGATED}})
        kube.kubectl("patch", "inferenceservices.llmfleet.dev/chat", "-n", namespace,
                     "--type=merge", "-p", patch)  # fmt: skip

        def switched() -> bool:
            pods = kube.get("pods", "-n", namespace, "-l", f"{L.SERVICE}=chat")["items"]
            pools = {pod["metadata"]["labels"][L.POOL] for pod in pods}
            ready = condition(kube, namespace, "chat").get("status") == "True"
            return ready and pools == {"prefill", "decode"}

        kube.wait_for(switched, 90, "Disaggregated, Ready, no unified pod left", interval=1)
        found = sources(kube, network_policy(kube, namespace, "chat") or {})
        siblings = engine_pods(kube, namespace, "chat", ("prefill", "decode"))
        assert found == [*ADMITTED, (siblings, None)]

        # The other service's policy is its own: its pods only, no sibling peer.
        other = network_policy(kube, namespace, "other")
        assert other is not None
        assert sources(kube, other) == ADMITTED
        others = admitted(kube, {"podSelector": other["spec"]["podSelector"]}, namespace)
        assert others == engine_pods(kube, namespace, "other", ("unified",))

        # Deleted with its service (owner reference: the garbage collector removes it).
        kube.kubectl("delete", "inferenceservices.llmfleet.dev/other", "-n", namespace)
        kube.wait_for(lambda: network_policy(kube, namespace, "other") is None, 60,
                      "the deleted service's NetworkPolicy to go")  # fmt: skip
    finally:
        operator.stop()
        print(operator.text()[-3000:])

    # Switched off: the operator prunes the policy it made.
    off = OPERATOR_ENV | {"LLMFLEET_OPERATOR_NETWORK_POLICY": "false"}
    operator = OperatorProcess(
        kube, logs / "operator-off.log", "--standalone", "-n", namespace, env=off
    )
    try:
        kube.wait_for(lambda: network_policy(kube, namespace, "chat") is None, 60,
                      "the NetworkPolicy pruned once switched off")  # fmt: skip

        def pruned() -> list[str]:
            return [e["message"] for e in kube.get("events", "-n", namespace)["items"]
                    if e["reason"] == "Pruned"]  # fmt: skip

        # The operator posts the event after the deletion the wait above saw: wait for it too.
        kube.wait_for(
            lambda: any("NetworkPolicy chat-engines" in message for message in pruned()), 30,
            "a Pruned event naming NetworkPolicy chat-engines",
        )  # fmt: skip
    finally:
        operator.stop()
