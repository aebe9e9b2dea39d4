"""A live service switches Unified -> Disaggregated -> Unified under traffic through the gateway
(issue 15): no client request fails during the change, and exactly the wanted children remain."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from e2e.system import LocalSystem, wait_for
from e2e.test_system import under_traffic

pytestmark = pytest.mark.e2e

NAME, MODEL = "switch", "switch-8b"
SERVICE = {
    "apiVersion": "llmfleet.dev/v1alpha1", "kind": "InferenceService",
    "metadata": {"name": NAME, "namespace": "default"},
    "spec": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "servedName": MODEL},
             # The samples' requests: sized for the real node, whose engines are the simulator.
             "runtime": {"gpu": {"type": "H100", "count": 1},
                         "resources": {"requests": {"cpu": "100m", "memory": "384Mi"}}},
             "topology": {"mode": "Unified", "unified": {"replicas": 1}}},
}  # fmt: skip
UNIFIED = {"mode": "Unified", "unified": {"replicas": 1},
           "prefill": None, "decode": None, "kvTransfer": None}  # fmt: skip
DISAGGREGATED = {"mode": "Disaggregated", "unified": None,
                 "prefill": {"replicas": 1}, "decode": {"replicas": 1},
                 "kvTransfer": {"connector": "NixlConnector"}}  # fmt: skip


@pytest.fixture
def switch(system: LocalSystem) -> Iterator[str]:
    system.kubectl("create", "-f", "-", stdin=json.dumps(SERVICE))
    try:
        system.wait_models([MODEL])
        yield NAME
    finally:
        system.kubectl("delete", "inferenceservice", NAME, "-n", "default", "--wait=false")


def children(system: LocalSystem) -> list[str]:
    kinds = "deployments,services,configmaps,poddisruptionbudgets"
    items = system.get(kinds, "-n", "default", "-l", f"llmfleet.dev/service={NAME}")["items"]
    return sorted(f"{item['kind']}/{item['metadata']['name']}" for item in items)


def wanted(pools: list[str]) -> list[str]:
    found = [f"ConfigMap/{NAME}-runtime", f"Service/{NAME}-metrics"]
    for pool in pools:
        found += [f"{kind}/{NAME}-{pool}" for kind in ("Deployment", "PodDisruptionBudget",
                                                       "Service")]  # fmt: skip
    return sorted(found)


def test_no_request_fails_while_the_topology_changes_twice(
    system: LocalSystem, switch: str
) -> None:
    failed: dict[str, object] = {}
    for topology, pools in ((DISAGGREGATED, ["prefill", "decode"]), (UNIFIED, ["unified"])):
        patch = json.dumps({"spec": {"topology": topology}})

        def change(patch: str = patch) -> None:
            system.kubectl("patch", "inferenceservice", switch, "-n", "default", "--type=merge",
                           "-p", patch)  # fmt: skip

        # Past the new engines' start (~8 s) and the old pool's drain (15 s locally).
        tally = under_traffic(system, change, model=MODEL, max_tokens=16, workers=4, after=30)
        print(tally.row(f"topology change to {topology['mode']}"))
        wait_for(lambda pools=pools: children(system) == wanted(pools) or None, 60,
                 f"exactly the children of {pools}")  # fmt: skip
        assert tally.lost == 0
        assert tally.answered > 0
        if tally.failed:
            failed[str(topology["mode"])] = dict(tally.failed)
    # Both ways, every request is answered: the old pools serve until the new engines answer
    # (their pods turn Ready only then, as with a kubelet's readiness probe).
    assert not failed, f"requests failed during the change to {failed}"
