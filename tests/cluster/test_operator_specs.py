"""The operator under specs written outside the project's own samples (issue 15): every Unicode
text, names at the length limit."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from llmfleet.crds import labels as L
from tests.cluster.kube import Kube, install_crds, wait_ready
from tests.cluster.operator_process import OperatorProcess

pytestmark = pytest.mark.cluster

SUFFIX = os.getpid() % 10000
NAMESPACES = {key: f"specs-{key}-{SUFFIX}" for key in ("unicode", "long")}
"""The module operator's namespaces (named up front, as in test_operator.py)."""


@pytest.fixture(scope="module")
def operator(kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    install_crds(kube)
    args = [arg for ns in NAMESPACES.values() for arg in ("-n", ns)]
    process = OperatorProcess(
        kube, tmp_path_factory.mktemp("operator") / "operator.log", "--standalone", *args
    )
    yield process
    process.stop()


def _namespace(key: str) -> Any:
    """A fixture giving a test its own namespace among those the module operator watches."""

    @pytest.fixture
    def fixture(kube: Kube, operator: OperatorProcess) -> Iterator[str]:
        name = NAMESPACES[key]
        kube.kubectl("create", "namespace", name)
        yield name
        kube.kubectl("delete", "namespace", name, "--timeout=120s")

    return fixture


ns_unicode = _namespace("unicode")
ns_long = _namespace("long")


def create(kube: Kube, ns: str, service: dict[str, Any]) -> None:
    """Create with a JSON body: `kubectl apply --server-side` would send the spec through the
    API server's YAML decoder, which is what this module tests the operator's own writes for."""
    kube.kubectl("create", "-n", ns, "-f", "-", stdin=json.dumps(service))


WIDE = "🚀 \U0001d518nicode \U0001d54f ✓ é 中文"
"""Characters beyond the Basic Multilingual Plane (an emoji, mathematical letters) and in it."""
YAML_TRAPS = "nel\x85 ls\u2028 ps\u2029 del\x7f c1\x9b bom\ufeff"
"""What YAML reads differently from JSON when written raw: line breaks it folds, characters it
refuses (see `llmfleet.operator.kube.apply_body`)."""


def test_non_bmp_characters_in_every_free_text_field_become_ready(
    kube: Kube, ns_unicode: str
) -> None:
    ns, name = ns_unicode, "unicode"
    value = f"{WIDE} {YAML_TRAPS}"
    service = {
        "apiVersion": "llmfleet.dev/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": name, "annotations": {"llmfleet.dev/note": WIDE}},
        "spec": {
            "model": {"name": f"org/{WIDE}", "servedName": f"served {WIDE}", "revision": WIDE,
                      "source": f"hf://org/{WIDE}"},
            "runtime": {
                "gpu": {"type": "H100", "count": 1},
                "speculative": {"method": "draft_model", "model": f"org/draft {WIDE}"},
                "extraArgs": ["--override-generation-config", json.dumps({"note": WIDE})],
                "env": [{"name": "GREETING", "value": value}],
            },
            "topology": {"unified": {"replicas": 1}},
            "traffic": {"cascade": {"hardKeywords": [WIDE, "\U0001d52d\U0001d52f\U0001d52c"]}},
        },
    }  # fmt: skip
    create(kube, ns, service)
    wait_ready(kube, ns, name)

    deployment = kube.get(f"deployment/{name}-unified", "-n", ns)
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["GREETING"] == value
    config = json.loads(kube.get(f"configmap/{name}-runtime", "-n", ns)["data"]["unified.json"])
    assert config["model"]["name"] == f"org/{WIDE}"
    assert config["model"]["servedName"] == f"served {WIDE}"
    assert config["runtime"]["extraArgs"][1] == json.dumps({"note": WIDE})
    assert config["runtime"]["speculative"]["model"] == f"org/draft {WIDE}"
    status = kube.get(f"inferenceservices.llmfleet.dev/{name}", "-n", ns)["status"]
    assert status["observedGeneration"] == 1


CHILD_SUFFIXES = ("-metrics", "-runtime", "-prefill", "-decode", "-unified")
LONGEST_NAME = 63 - max(map(len, CHILD_SUFFIXES))
"""A Service name is a DNS label (63 characters) and the longest suffix a child adds is 8."""


@pytest.mark.parametrize("mode", ["Unified", "Disaggregated"])
def test_a_name_at_the_length_limit_becomes_ready(kube: Kube, ns_long: str, mode: str) -> None:
    ns = ns_long
    name = f"long-{mode.lower()}-".ljust(LONGEST_NAME, "x")
    assert len(name) == 55
    topology: dict[str, Any] = {"mode": mode}
    if mode == "Unified":
        topology["unified"] = {"replicas": 1}
    else:
        topology |= {"prefill": {"replicas": 1}, "decode": {"replicas": 1},
                     "kvTransfer": {"connector": "NixlConnector"}}  # fmt: skip
    service = {
        "apiVersion": "llmfleet.dev/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {"model": {"name": "org/m"}, "runtime": {"gpu": {"type": "H100", "count": 1}},
                 "topology": topology},
    }  # fmt: skip
    create(kube, ns, service)
    wait_ready(kube, ns, name)
    children = kube.get("deployments,services,configmaps,poddisruptionbudgets", "-n", ns,
                        "-l", f"{L.SERVICE}={name}")["items"]  # fmt: skip
    longest = max(len(child["metadata"]["name"]) for child in children)
    assert longest == 63
