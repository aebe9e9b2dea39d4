"""Engine pods under Pod Security `restricted`, and a gated model's token kept out of every
object (issue 27, items 1 and 5).

The API server's own PodSecurity admission plugin judges the pods, so kwok's fake nodes do:
- every sample's children, as the operator renders them, pass a server-side dry run into a
  namespace that enforces `restricted` (each Deployment's pod template as a Pod, since
  enforcement applies to pods; the Deployments themselves with no warning);
- a pod with one of them undone is refused there (the namespace enforces);
- with the operator running, a gated model whose `HF_TOKEN` comes from a Secret gets its pods
  created in such a namespace, and the token's value is in no object of the namespace (the
  Secret aside) and not in the operator's log.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmfleet.crds import InferenceService
from llmfleet.operator.observed import Observed
from llmfleet.operator.plan import desired
from llmfleet.operator.settings import OperatorSettings
from tests.cluster.kube import Kube, install_crds
from tests.cluster.operator_process import OperatorProcess
from tests.crds.cases import SAMPLES

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
LOCAL_SAMPLES = ROOT / "core" / "llmfleet" / "core" / "local" / "samples" / "services.yaml"
GATED = Path(__file__).resolve().parent / "samples" / "gated.yaml"
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
    "pod-security.kubernetes.io/warn": "restricted",
    "pod-security.kubernetes.io/warn-version": "latest",
}
SUFFIX = os.getpid() % 10000
NOW = datetime(2026, 11, 27, tzinfo=UTC)


def _services() -> list[tuple[str, dict[str, Any]]]:
    found: list[tuple[str, dict[str, Any]]] = []
    for path in [*SAMPLES, LOCAL_SAMPLES, GATED]:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "InferenceService":
                found.append((f"{path.stem}-{doc['metadata']['name']}", doc))
    return found


SERVICES = _services()


def _restricted_namespace(kube: Kube, name: str) -> Iterator[str]:
    kube.kubectl("create", "namespace", name)
    kube.kubectl("label", "namespace", name, *(f"{k}={v}" for k, v in RESTRICTED.items()))
    kube.wait_for(
        lambda: kube.ok("get", "serviceaccount", "default", "-n", name),
        30,
        f"the default ServiceAccount in {name}",
    )
    yield name
    kube.kubectl("delete", "namespace", name, "--timeout=120s")


@pytest.fixture(scope="module")
def restricted(kube: Kube) -> Iterator[str]:
    yield from _restricted_namespace(kube, f"restricted-{SUFFIX}")


def _children(manifest: dict[str, Any], namespace: str) -> list[dict[str, Any]]:
    manifest = json.loads(json.dumps(manifest))
    manifest["metadata"].update(namespace=namespace, uid="00000000-0000-0000-0000-000000000001")
    service = InferenceService.model_validate(manifest)
    return list(desired(service, Observed(), OperatorSettings(), NOW).objects)


def _as_pod(deployment: dict[str, Any]) -> dict[str, Any]:
    template = deployment["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{deployment['metadata']['name']}-pod",
            "namespace": deployment["metadata"]["namespace"],
            "labels": template["metadata"]["labels"],
        },
        "spec": template["spec"],
    }


def _dry_run(kube: Kube, manifest: dict[str, Any]) -> tuple[int, str]:
    result = kube.run(
        "apply", "--dry-run=server", "--server-side", "--field-manager=llmfleet-tests",
        "-f", "-", stdin=json.dumps(manifest),
    )  # fmt: skip
    return result.returncode, result.stderr


@pytest.mark.parametrize(("sample", "manifest"), SERVICES, ids=[s for s, _ in SERVICES])
def test_every_sample_passes_pod_security_restricted(
    kube: Kube, restricted: str, sample: str, manifest: dict[str, Any]
) -> None:
    objects = _children(manifest, restricted)
    deployments = [o for o in objects if o["kind"] == "Deployment"]
    assert deployments, f"{sample}: no Deployment rendered"
    for child in objects:
        code, stderr = _dry_run(kube, child)
        assert code == 0, f"{sample}: {child['kind']} {child['metadata']['name']}: {stderr}"
        # `warn: restricted` makes the API server say what a pod template would violate.
        assert "Warning" not in stderr, f"{sample}: {child['metadata']['name']}: {stderr}"
    for deployment in deployments:
        code, stderr = _dry_run(kube, _as_pod(deployment))
        assert code == 0, f"{sample}: the pod of {deployment['metadata']['name']}: {stderr}"


def _no_container_context(pod: dict[str, Any]) -> None:
    del pod["containers"][0]["securityContext"]


def _escalation(pod: dict[str, Any]) -> None:
    pod["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True


def _root(pod: dict[str, Any]) -> None:
    pod["securityContext"]["runAsUser"] = 0


def _host_path(pod: dict[str, Any]) -> None:
    pod["volumes"][-1] = {"name": pod["volumes"][-1]["name"], "hostPath": {"path": "/models"}}


BREACHES = {
    "no container securityContext": _no_container_context,
    "privilege escalation": _escalation,
    "uid 0": _root,
    "a hostPath model cache": _host_path,
}


@pytest.mark.parametrize("breach", list(BREACHES))
def test_the_namespace_refuses_an_engine_pod_with_one_thing_undone(
    kube: Kube, restricted: str, breach: str
) -> None:
    """The control: the dry runs above pass because of the security contexts, not because
    nothing is enforced. (Without the pod's securityContext the pod still passes: the
    container's own says runAsNonRoot and seccomp, as `restricted` asks of one or the other.)"""
    _, manifest = SERVICES[0]
    deployment = next(o for o in _children(manifest, restricted) if o["kind"] == "Deployment")
    pod = _as_pod(deployment)
    BREACHES[breach](pod["spec"])
    code, stderr = _dry_run(kube, pod)
    assert code != 0, f"{breach}: admitted"
    assert "violates PodSecurity" in stderr, stderr


@pytest.fixture
def gated_namespace(kube: Kube) -> Iterator[str]:
    yield from _restricted_namespace(kube, f"gated-{SUFFIX}")


def test_a_gated_models_token_stays_in_its_secret(
    kube: Kube, gated_namespace: str, tmp_path: Path
) -> None:
    install_crds(kube)
    docs = [doc for doc in yaml.safe_load_all(GATED.read_text()) if doc]
    [secret] = [doc for doc in docs if doc["kind"] == "Secret"]
    token = secret["stringData"]["token"]
    log = tmp_path / "operator.log"
    operator = OperatorProcess(kube, log, "--standalone", "-n", gated_namespace)
    try:
        kube.kubectl("apply", "-n", gated_namespace, "-f", str(GATED))
        # The ReplicaSet's pods are admitted by `restricted` and run (kwok): the pod is real.
        kube.wait_for(
            lambda: kube.get("pods", "-n", gated_namespace, "-l", "llmfleet.dev/service=gated")[
                "items"
            ],
            90,
            "the gated service's engine pod",
        )
        deployment = kube.get("deployment", "gated-unified", "-n", gated_namespace)
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        [entry] = [var for var in container["env"] if var["name"] == "HF_TOKEN"]
        assert entry == {
            "name": "HF_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}},
        }
    finally:
        operator.stop()
    kinds = kube.kubectl("api-resources", "--verbs=list", "--namespaced", "-o", "name").split()
    readable = [kind for kind in kinds if kind not in ("secrets", "bindings")]
    everything = kube.kubectl("get", ",".join(readable), "-n", gated_namespace, "-o", "json")
    assert "gated-unified" in everything  # the grep reads the operator's objects
    assert "hf-token" in everything  # ... and the reference to the Secret
    assert token not in everything
    events = kube.kubectl("get", "events", "-n", gated_namespace, "-o", "json")
    assert token not in events
    assert token not in operator.text()
