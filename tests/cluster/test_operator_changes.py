"""A live service changes shape (issue 15): Unified -> Disaggregated -> Unified leaves exactly
the children the spec wants, serves throughout, and never touches a look-alike."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from llmfleet.crds import labels as L
from tests.cluster.kube import Kube, condition, install_crds, wait_endpoints, wait_ready
from tests.cluster.operator_process import OperatorProcess

pytestmark = pytest.mark.cluster

NAMESPACE = f"changes-{os.getpid() % 10000}"
CHILD_KINDS = "deployments,services,configmaps,poddisruptionbudgets"


@pytest.fixture
def ns(kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A namespace with an operator of its own watching it."""
    install_crds(kube)
    kube.kubectl("create", "namespace", NAMESPACE)
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    process = OperatorProcess(kube, log, "--standalone", "-n", NAMESPACE)
    try:
        yield NAMESPACE
    finally:
        process.stop()
        print(process.text()[-3000:])
        kube.kubectl("delete", "namespace", NAMESPACE, "--timeout=120s")


UNIFIED = {"mode": "Unified", "unified": {"replicas": 1},
           "prefill": None, "decode": None, "kvTransfer": None}  # fmt: skip
DISAGGREGATED = {"mode": "Disaggregated", "unified": None,
                 "prefill": {"replicas": 1}, "decode": {"replicas": 1},
                 "kvTransfer": {"connector": "NixlConnector"}}  # fmt: skip


def look_alike(name: str, labels: dict[str, str], owner: dict[str, Any] | None) -> str:
    """A Deployment (no pods) named and labelled like a child, which pruning must leave alone."""
    deployment: dict[str, Any] = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"look-alike": name}},
                 "template": {"metadata": {"labels": {"look-alike": name}},
                              "spec": {"containers": [{"name": "c", "image": "x"}]}}},
    }  # fmt: skip
    if owner is not None:
        deployment["metadata"]["ownerReferences"] = [owner]
    return json.dumps(deployment)


def serving_by_pool(kube: Kube, ns: str, name: str) -> dict[str, int]:
    """Ready endpoints per pool, from one list of the EndpointSlices (one snapshot: a look at
    each pool in turn could see the new pool before it filled and the old after it emptied)."""
    slices = kube.get("endpointslices", "-n", ns, "-l", f"{L.SERVICE}={name},{L.POOL}")["items"]
    counts: dict[str, int] = {}
    for item in slices:
        pool = item["metadata"]["labels"][L.POOL]
        ready = [e for e in item.get("endpoints") or [] if e.get("conditions", {}).get("ready")]
        counts[pool] = counts.get(pool, 0) + len(ready)
    return counts


def children(kube: Kube, ns: str, name: str) -> list[str]:
    items = kube.get(CHILD_KINDS, "-n", ns, "-l", f"{L.SERVICE}={name}")["items"]
    return sorted(f"{item['kind']}/{item['metadata']['name']}" for item in items)


def wanted(name: str, pools: list[str]) -> list[str]:
    found = [f"ConfigMap/{name}-runtime", f"Service/{name}-metrics"]
    for pool in pools:
        found += [f"Deployment/{name}-{pool}", f"PodDisruptionBudget/{name}-{pool}",
                  f"Service/{name}-{pool}"]  # fmt: skip
    return found


def test_unified_to_disaggregated_to_unified_leaves_exactly_the_wanted_children(
    kube: Kube, ns: str
) -> None:
    name = "switch"
    service = {
        "apiVersion": "llmfleet.dev/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {"model": {"name": "org/m"}, "runtime": {"gpu": {"type": "H100", "count": 1}},
                 "topology": {"mode": "Unified", "unified": {"replicas": 1}}},
    }  # fmt: skip
    kube.kubectl("create", "-n", ns, "-f", "-", stdin=json.dumps(service))
    wait_ready(kube, ns, name)
    uid = kube.get(f"inferenceservices.llmfleet.dev/{name}", "-n", ns)["metadata"]["uid"]
    owner = {"apiVersion": "llmfleet.dev/v1alpha1", "kind": "InferenceService", "name": name,
             "uid": uid, "controller": True}  # fmt: skip
    ours = {L.SERVICE: name, L.MANAGED_BY: L.MANAGED_BY_VALUE}
    # Same labels, no owner reference; owned but not labelled by the operator.
    strangers = {
        "Deployment/switch-prefill-copy":
            look_alike("switch-prefill-copy", ours | {L.POOL: "prefill"}, None),
        "Deployment/switch-decode-extra":
            look_alike("switch-decode-extra", {L.SERVICE: name, L.POOL: "decode"}, owner),
    }  # fmt: skip
    for manifest in strangers.values():
        kube.kubectl("create", "-n", ns, "-f", "-", stdin=manifest)

    for topology, pools in ((DISAGGREGATED, ["prefill", "decode"]), (UNIFIED, ["unified"])):
        before = [pool for pool in ("unified", "prefill", "decode") if pool not in pools]
        # The pools now serving, in their EndpointSlices (which follow pod readiness
        # asynchronously, after Ready), before the change: else a first look finds no pool.
        for pool in before:
            wait_endpoints(kube, ns, f"{name}-{pool}", 1)
        patch = json.dumps({"spec": {"topology": topology}})
        kube.kubectl("patch", f"inferenceservices.llmfleet.dev/{name}", "-n", ns,
                     "--type=merge", "-p", patch)  # fmt: skip
        gaps: list[str] = []

        def settled(
            pools: list[str] = pools, before: list[str] = before, gaps: list[str] = gaps
        ) -> bool:
            # Make-before-break: at every look, the old pools or the new ones serve.
            serving = serving_by_pool(kube, ns, name)
            if not all(serving.get(p) for p in pools) and not all(serving.get(p) for p in before):
                gaps.append(str(serving))
            found = children(kube, ns, name)
            return found == sorted(wanted(name, pools) + list(strangers)) and (
                condition(kube, ns, name).get("status") == "True"
            )

        kube.wait_for(settled, 90, f"exactly the children of {pools} and Ready")
        assert gaps == [], f"no pool served at some point: {gaps}"

        def live(pools: list[str] = pools) -> bool:
            # The old pool's pods go after its Deployment, by the garbage collector (background
            # propagation): a moment after the Deployment is gone, they may still be there.
            pods = kube.get("pods", "-n", ns, "-l", f"{L.SERVICE}={name}")["items"]
            return {p["metadata"]["labels"][L.POOL] for p in pods
                    if not p["metadata"].get("deletionTimestamp")} == set(pools)  # fmt: skip

        kube.wait_for(live, 60, f"live pods in {pools} only")

        def status_pools(pools: list[str] = pools) -> bool:
            # The pass that deletes the old children writes the status after the deletion.
            status = kube.get(f"inferenceservices.llmfleet.dev/{name}", "-n", ns)["status"]
            return sorted(status["pools"]) == sorted(pools)

        kube.wait_for(status_pools, 30, f"status.pools to be {pools}")
        progressing = condition(kube, ns, name, "Progressing")
        print(f"{pools}: Progressing={progressing['status']} {progressing['reason']}")

    pruned = [e for e in kube.get("events", "-n", ns)["items"] if e["reason"] == "Pruned"]
    assert len(pruned) >= 2
    for event in pruned:
        print(f"Pruned: {event['message']}")
