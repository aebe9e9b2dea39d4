"""The operator under specs written outside the project's own samples (issue 15): every Unicode
text, names at the length limit, children the API server refuses, zero replicas, a GPU budget
smaller than what spares and the autoscaler ask for."""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from llmfleet.crds import labels as L
from tests.cluster.kube import Kube, condition, install_crds, wait_ready
from tests.cluster.operator_process import OperatorProcess

pytestmark = pytest.mark.cluster

SUFFIX = os.getpid() % 10000
RETRY, RETRY_MAX = 1.0, 4.0
"""The module operator's back-off after a refusal: 1 s, doubling up to 4 s."""
NAMESPACES = {
    key: f"specs-{key}-{SUFFIX}" for key in ("unicode", "long", "refused", "zero", "budget")
}
"""The module operator's namespaces (named up front, as in test_operator.py)."""


@pytest.fixture(scope="module")
def operator(kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    install_crds(kube)
    args = [arg for ns in NAMESPACES.values() for arg in ("-n", ns)]
    process = OperatorProcess(
        kube, tmp_path_factory.mktemp("operator") / "operator.log", "--standalone", *args,
        env={"LLMFLEET_OPERATOR_RETRY_SECONDS": str(RETRY), "LLMFLEET_OPERATOR_RETRY_MAX_SECONDS":
             str(RETRY_MAX)},
    )  # fmt: skip
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
ns_refused = _namespace("refused")
ns_zero = _namespace("zero")
ns_budget = _namespace("budget")


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
            # The model's name and source are hub repository ids (ASCII, admission checks), and
            # a revision has no spaces: the free text is elsewhere.
            "model": {"name": "org/unicode", "servedName": f"served {WIDE}",
                      "revision": WIDE.replace(" ", "-")},
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
    assert config["model"]["revision"] == WIDE.replace(" ", "-")
    assert config["model"]["servedName"] == f"served {WIDE}"
    assert config["runtime"]["extraArgs"][1] == json.dumps({"note": WIDE})
    assert config["runtime"]["speculative"]["model"] == f"org/draft {WIDE}"
    status = kube.get(f"inferenceservices.llmfleet.dev/{name}", "-n", ns)["status"]
    assert status["observedGeneration"] == 1


@pytest.mark.parametrize("mode", ["Unified", "Disaggregated"])
def test_a_name_at_the_length_limit_becomes_ready(kube: Kube, ns_long: str, mode: str) -> None:
    ns = ns_long
    name = f"long-{mode.lower()}-".ljust(L.SERVICE_NAME_MAX_LENGTH, "x")  # admission's limit
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
    assert longest == L.DNS_LABEL_MAX_LENGTH


def refuse_deployment(kube: Kube, ns: str, name: str) -> str:
    """A ValidatingAdmissionPolicy (CEL, no webhook) that refuses the Deployment `name` in `ns`
    as invalid (422), as the API server would refuse an invalid field; returns its binding."""
    policy = f"refuse-{ns}"
    kube.kubectl("apply", "--server-side", "-f", "-", stdin=json.dumps({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": policy},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [{"apiGroups": ["apps"], "apiVersions": ["v1"],
                                   "operations": ["CREATE", "UPDATE"],
                                   "resources": ["deployments"]}],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            },
            "validations": [{"expression": f"object.metadata.name != '{name}'",
                             "message": "the test's policy refuses this Deployment",
                             "reason": "Invalid"}],
        },
    }))  # fmt: skip
    kube.kubectl("apply", "--server-side", "-f", "-", stdin=json.dumps({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": policy},
        "spec": {"policyName": policy, "validationActions": ["Deny"]},
    }))  # fmt: skip
    probe = ["create", "deployment", name, "--image=x", "-n", ns, "--dry-run=server"]
    kube.wait_for(lambda: "refuses this Deployment" in kube.run(*probe).stderr, 30,
                  "the admission policy to refuse the Deployment")  # fmt: skip
    return policy


LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def refusal_times(log: str, child: str) -> list[datetime]:
    """When the operator logged a refusal of `child` (its log's own timestamps)."""
    times = []
    for line in log.splitlines():
        match = LOG_TIME.match(line)
        if match and f"the API server refused {child} " in line:
            times.append(datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f"))
    return times


def warnings(kube: Kube, ns: str, reason: str) -> list[dict[str, Any]]:
    events = kube.get("events", "-n", ns, "--field-selector", "type=Warning")["items"]
    return [event for event in events if event["reason"] == reason]


def test_refused_children_give_a_status_a_warning_once_and_one_line_per_back_off_step(
    kube: Kube, operator: OperatorProcess, ns_refused: str
) -> None:
    ns, name = ns_refused, "refused"
    deployment, budget = f"Deployment {name}-unified", f"PodDisruptionBudget {name}-unified"
    # 403 for the PodDisruptionBudget (a quota), 422 for the Deployment (an admission policy).
    kube.kubectl("create", "quota", "no-budgets", "-n", ns,
                 "--hard=count/poddisruptionbudgets.policy=0")  # fmt: skip
    policy = refuse_deployment(kube, ns, f"{name}-unified")
    try:
        service = {
            "apiVersion": "llmfleet.dev/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": name},
            "spec": {"model": {"name": "org/m"}, "topology": {"unified": {"replicas": 1}}},
        }  # fmt: skip
        create(kube, ns, service)
        kube.wait_for(lambda: condition(kube, ns, name).get("reason") == "InvalidSpec", 30,
                      "Ready=False InvalidSpec")  # fmt: skip
        ready, degraded = condition(kube, ns, name), condition(kube, ns, name, "Degraded")
        print(f"Ready={ready['status']} {ready['reason']}: {ready['message']}")
        assert ready["status"] == "False"
        assert (degraded["status"], degraded["reason"]) == ("True", "InvalidSpec")
        assert "the test's policy refuses this Deployment" in ready["message"]
        assert "exceeded quota: no-budgets" in ready["message"]
        # The children the API server takes are applied.
        assert kube.ok("get", f"service/{name}-unified", f"service/{name}-metrics",
                       f"configmap/{name}-runtime", "-n", ns)  # fmt: skip

        # Over a window of several back-off steps: one line per step, one Warning in all.
        kube.wait_for(lambda: len(refusal_times(operator.text(), deployment)) >= 5, 60,
                      "five tries of the refused Deployment")  # fmt: skip
        for child in (deployment, budget):
            times = refusal_times(operator.text(), child)
            gaps = [
                (later - earlier).total_seconds() for earlier, later in itertools.pairwise(times)
            ]
            steps = [min(RETRY * 2**k, RETRY_MAX) for k in range(len(gaps))]
            print(f"{child}: tried after {[round(gap, 2) for gap in gaps]} s (back-off {steps})")
            # The log's timestamps are in milliseconds: a step may look 1 ms short.
            assert all(gap >= step - 0.002 for gap, step in zip(gaps, steps, strict=True)), (
                gaps,
                steps,
            )
        assert len(warnings(kube, ns, "InvalidSpec")) == 1
        assert "Traceback" not in operator.text()
    finally:
        kube.kubectl("delete", "validatingadmissionpolicybinding", policy)
        kube.kubectl("delete", "validatingadmissionpolicy", policy)

    # The Deployment is taken at its next try; the quota still refuses the budget (403).
    kube.wait_for(lambda: condition(kube, ns, name).get("reason") == "ApplyFailed", 30,
                  "Ready=False ApplyFailed once only the quota refuses")  # fmt: skip
    assert kube.ok("get", f"deployment/{name}-unified", "-n", ns)
    assert len(warnings(kube, ns, "ApplyFailed")) == 1
    kube.kubectl("delete", "quota", "no-budgets", "-n", ns)
    wait_ready(kube, ns, name, timeout=30)
    assert condition(kube, ns, name, "Degraded")["status"] == "False"


def small(name: str, replicas: int, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "llmfleet.dev/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {"model": {"name": "org/m"}, "runtime": {"gpu": {"type": "H100", "count": 1}},
                 "topology": {"unified": {"replicas": replicas, "maxReplicas": 8}}, **spec},
    }  # fmt: skip


def test_zero_replicas_is_not_ready_and_one_is(kube: Kube, ns_zero: str) -> None:
    ns, name = ns_zero, "zero"
    create(kube, ns, small(name, 0))
    kube.wait_for(lambda: condition(kube, ns, name).get("reason") == "ScaledToZero", 30,
                  "Ready=False ScaledToZero")  # fmt: skip
    ready = condition(kube, ns, name)
    print(f"Ready={ready['status']} {ready['reason']}: {ready['message']}")
    assert ready["status"] == "False"
    assert condition(kube, ns, name, "Degraded")["status"] == "False"
    listing = kube.kubectl("get", "llmsvc", "-n", ns)
    print(listing)
    assert listing.splitlines()[1].split()[2] == "False"  # the READY column
    kube.kubectl("patch", f"inferenceservices.llmfleet.dev/{name}", "-n", ns, "--type=merge",
                 "-p", '{"spec":{"topology":{"unified":{"replicas":1}}}}')  # fmt: skip
    wait_ready(kube, ns, name)


def test_spares_and_autoscaler_decisions_stay_within_the_gpu_budget(
    kube: Kube, ns_budget: str
) -> None:
    ns, name, budget = ns_budget, "budget", 3
    autoscaling = {"enabled": True, "warmSpares": 2, "gpuBudget": budget}
    create(kube, ns, small(name, 2, autoscaling=autoscaling))
    wait_ready(kube, ns, name)
    most: list[int] = []

    def pods() -> int:
        found = kube.get("pods", "-n", ns, "-l", f"{L.SERVICE}={name}")["items"]
        most.append(len(found))
        return len(found)

    limited = kube.wait_for(
        lambda: (c := condition(kube, ns, name, "ScalingLimited")).get("status") == "True" and c,
        30, "ScalingLimited=True",
    )  # fmt: skip
    print(f"ScalingLimited {limited['reason']}: {limited['message']}")
    assert limited["reason"] == "GPUBudget"
    assert "2 active + 1 spare of 2 + 2 wanted (spec)" in limited["message"]
    kube.wait_for(lambda: pods() == budget, 30, f"{budget} pods (2 active + 1 spare)")

    # An autoscaler decision beyond the budget (written as the autoscaler writes it).
    decision = {"pools": {"unified": {"active": 6, "spares": 1, "reason": "test"}}}
    kube.kubectl("patch", f"inferenceservices.llmfleet.dev/{name}", "-n", ns,
                 "--subresource=status", "--type=merge",
                 "-p", json.dumps({"status": {"autoscaling": decision}}))  # fmt: skip
    kube.wait_for(lambda: "of 6 + 1 wanted (autoscaler)" in condition(
        kube, ns, name, "ScalingLimited").get("message", ""), 30, "the cut decision")  # fmt: skip
    message = condition(kube, ns, name, "ScalingLimited")["message"]
    assert "unified runs 3 active + 0 spare of 6 + 1 wanted (autoscaler)" in message
    kube.wait_for(lambda: len(serving(kube, ns, name)) == budget, 30, "3 serving pods")
    for _ in range(10):  # a while of watching: never a pod more
        pods()
    deployment = kube.get(f"deployment/{name}-unified", "-n", ns)
    assert deployment["spec"]["replicas"] == budget
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert max(most) <= budget, most
    assert warnings(kube, ns, "GPUBudget")


def serving(kube: Kube, ns: str, name: str) -> list[str]:
    selector = f"{L.SERVICE}={name},{L.SERVING}=true"
    return [p["metadata"]["name"] for p in kube.get("pods", "-n", ns, "-l", selector)["items"]]
