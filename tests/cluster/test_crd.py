"""The rendered InferenceService CRD on the real API server: samples and manifests just inside
the rules apply, invalid manifests are refused at admission with a message naming the field (our
rule's words, or the API server's own for the schema's refusals), and `kubectl get llmsvc` has
columns."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmfleet.crds import admission_policy, engine_args, kubectl_yaml, render, validation
from llmfleet.crds._base import ApiModel
from llmfleet.crds.labels import ROLLOUT_PAUSE
from llmfleet.crds.spec import IMAGE_NAME_MAX, image_name_length
from tests.cluster.kube import Kube
from tests.crds.cases import (
    BASE,
    CASES,
    SAMPLES,
    VALID_AT_THE_EDGE,
    YAML_DIALECT,
    Case,
    changed,
)
from tests.runtime.test_admission_agrees import WORDS

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def namespace(kube: Kube) -> Iterator[str]:
    """One namespace for the module: these tests create no pods, so they can share it."""
    for manifest in (render.CRD_FILE, render.POLICY_FILE):
        kube.kubectl("apply", "--server-side", "--field-manager=llmfleet-tests", "-f",
                     str(manifest))  # fmt: skip
    # NOTE: right after a changed CRD is applied its conditions may not be there yet (`kubectl
    # wait` then fails instead of waiting), and a session started right after another finds
    # the namespace still terminating: both are waited for.
    established = '{.status.conditions[?(@.type=="Established")].status}'
    kube.wait_for(lambda: kube.run("get", f"crd/{render.CRD_NAME}", "-o",
                                   f"jsonpath={established}").stdout == "True",
                  timeout=30, what="the CRD to be established")  # fmt: skip
    kube.wait_for(lambda: kube.run("create", "namespace", "crd-tests").returncode == 0
                  or kube.run("get", "namespace", "crd-tests", "-o",
                              "jsonpath={.status.phase}").stdout == "Active",
                  timeout=120, what="namespace crd-tests")  # fmt: skip
    # A new admission policy is enforced once the API server has compiled it: a moment after.
    paused = changed({"metadata.annotations": {ROLLOUT_PAUSE: "yes"}})
    kube.wait_for(lambda: kube.run("apply", "--server-side", "--dry-run=server", "-n",
                                   "crd-tests", "-f", "-", stdin=json.dumps(paused)).returncode,
                  timeout=60, what="the admission policy to be enforced")  # fmt: skip
    yield "crd-tests"
    kube.kubectl("delete", "namespace", "crd-tests", "--wait=false")


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda path: path.stem)
def test_sample_applies(kube: Kube, namespace: str, sample: Path) -> None:
    kube.kubectl("apply", "--server-side", "-n", namespace, "-f", str(sample))
    listing = kube.kubectl("get", "llmsvc", "-n", namespace)
    header = listing.splitlines()[0].split()
    assert header == ["NAME", "MODE", "READY", "SERVING", "CANARY", "ENDPOINT", "AGE"]
    name = yaml.safe_load(sample.read_text())["metadata"]["name"]
    stored = kube.get(f"inferenceservices.llmfleet.dev/{name}", "-n", namespace)
    # Defaults are applied by the API server from the rendered schema.
    assert stored["spec"]["runtime"]["prefixCaching"] is True
    assert stored["spec"]["topology"]["mode"] in ("Unified", "Disaggregated")
    wide = kube.kubectl("get", "llmsvc", "-n", namespace, "-o", "wide").splitlines()[0].split()
    assert wide[-3:] == ["REASON", "MODEL", "METRICS"]


def test_the_base_of_the_invalid_cases_is_accepted(kube: Kube, namespace: str) -> None:
    kube.kubectl("apply", "--server-side", "--dry-run=server", "-n", namespace, "-f", "-",
                 stdin=yaml.safe_dump(BASE))  # fmt: skip


@pytest.mark.parametrize("name", VALID_AT_THE_EDGE)
def test_a_manifest_just_inside_the_rules_is_accepted(
    kube: Kube, namespace: str, name: str
) -> None:
    kube.kubectl("apply", "--server-side", "--dry-run=server", "-n", namespace, "-f", "-",
                 stdin=kubectl_yaml.dump(VALID_AT_THE_EDGE[name]))  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_invalid_manifest_is_refused_naming_the_field(
    kube: Kube, namespace: str, case: Case
) -> None:
    result = kube.run("apply", "--server-side", "--dry-run=server", "-n", namespace, "-f", "-",
                      stdin=case.yaml())  # fmt: skip
    assert result.returncode != 0, f"{case.id} was accepted"
    print(f"{case.id}: {result.stderr.strip()}")
    assert case.field in result.stderr
    assert (case.message or case.api_says) in result.stderr


def _verdicts(kube: Kube, namespace: str, text: str) -> tuple[str, list[str]]:
    """(what the API server said, or "" when it accepted; `llmfleet validate`'s lines) for one
    manifest as kubectl reads it."""
    result = kube.run("apply", "--server-side", "--dry-run=server", "-n", namespace, "-f", "-",
                      stdin=text)  # fmt: skip
    lines = [
        f"{problem.path}: {problem.message}"
        for _, document in validation.documents(text)
        for problem in validation.problems(document)
    ]
    return ("" if result.returncode == 0 else result.stderr.strip() or "refused"), lines


CROSS_CHECKED = [
    *(pytest.param(sample.read_text(), None, id=f"sample-{sample.stem}") for sample in SAMPLES),
    *(
        pytest.param(kubectl_yaml.dump(manifest), None, id=f"valid-{name}")
        for name, manifest in VALID_AT_THE_EDGE.items()
    ),
    *(pytest.param(case.yaml(), case.field, id=case.id) for case in CASES),
    *(pytest.param(text, field, id=f"yaml-{n}") for n, (text, field) in YAML_DIALECT.items()),
]


@pytest.mark.parametrize(("text", "field"), CROSS_CHECKED)
def test_validate_gives_the_api_servers_verdict(
    kube: Kube, namespace: str, text: str, field: str | None
) -> None:
    """`llmfleet validate` and a server-side dry run agree on every manifest of the tables: both
    accept it, or both refuse it naming the same field."""
    api_says, validate_says = _verdicts(kube, namespace, text)
    if field is None:
        assert (api_says, validate_says) == ("", [])
    else:
        assert field in api_says, api_says
        assert any(line.startswith(field) for line in validate_says), validate_says


TYPED = {
    "tensorParallel": [1, 2], "quantization": ["awq"], "kvCacheDtype": ["auto", "fp8"],
    "prefixCaching": [True, False], "cudaGraphs": [True, False], "maxNumSeqs": [64, 256],
    "gpuMemoryUtilization": [0.9], "speculative": [{"method": "ngram"}],
    "chunkedPrefill": [{"enabled": False}, {"enabled": True, "maxBatchedTokens": 256}],
}  # fmt: skip


def drawn_runtime(seed: int) -> dict[str, Any]:
    """One manifest of a seeded draw: typed runtime fields and extraArgs from the property test's
    words (tests/runtime/test_admission_agrees.py), over both topologies and sources."""
    rng = random.Random(f"issue-29-{seed}")
    runtime: dict[str, Any] = {"gpu": {"type": "H100", "count": rng.choice([1, 2, 4])}}
    runtime |= {key: rng.choice(values) for key, values in TYPED.items() if rng.random() < 0.3}
    # Options followed, mostly, by a value when they take one; now and then any word.
    options = [word for word in WORDS if engine_args.is_option(word) and " " not in word]
    values = [word for word in WORDS if not engine_args.is_option(word)]
    words: list[str] = []
    for _ in range(rng.randint(1, 3)):
        option = rng.choice(options)
        words.append(option)
        takes_one = engine_args.split([option])[0].flag in engine_args.VALUE_OPTIONS
        if takes_one and "=" not in option and rng.random() < 0.8:
            words.append(rng.choice(values))
        if rng.random() < 0.15:
            words.append(rng.choice(WORDS))
    runtime["extraArgs"] = words
    model: dict[str, Any] = {"name": "org/model"}
    if rng.random() < 0.4:
        model["maxModelLen"] = rng.choice([2048, 8192])
    if rng.random() < 0.3:
        model["source"] = rng.choice(["hf://org/model", "s3://bucket/model"])
    topology: dict[str, Any] = {"mode": "Unified", "unified": {"replicas": 1}}
    if rng.random() < 0.3:
        kv = {"connector": "NixlConnector"}
        topology = {"mode": "Disaggregated", "prefill": {"replicas": 1},
                    "decode": {"replicas": 1}, "kvTransfer": kv}  # fmt: skip
    return {
        "apiVersion": "llmfleet.dev/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": f"drawn-{seed}"},
        "spec": {"model": model, "runtime": runtime, "topology": topology},
    }  # fmt: skip


@pytest.mark.parametrize("seed", range(80))
def test_the_cel_rules_of_extra_args_give_their_python_twins_verdict(
    kube: Kube, namespace: str, seed: int
) -> None:
    """The property test compares the launcher with the rules' Python twins; this compares the
    twins with the CEL the API server runs, on a seeded draw of the same words: both accept, or
    both refuse and every message Python gives is among the API server's."""
    document = drawn_runtime(seed)
    found = validation.problems(document)
    # As JSON: PyYAML would write a word such as 08192 plain, which kubectl reads as a number.
    result = kube.run("apply", "--server-side", "--dry-run=server", "-n", namespace, "-f", "-",
                      stdin=json.dumps(document))  # fmt: skip
    said = result.stderr
    assert (result.returncode == 0) == (found == []), (document["spec"]["runtime"], found, said)
    missing = [problem.message for problem in found if problem.message not in said]
    assert missing == [], (document["spec"]["runtime"], said)


PIPELINE_WORDS = [
    ["-pp", "2"], ["-pp=3"], ["-pp", "8"], ["-pp", "2", "-tp", "2"], ["-tp=4", "-pp", "2"],
    ["-pp", "2", "-dp", "2"], ["-tp", "1", "-pp", "2", "-dp", "2"], ["-tp", "x", "-pp", "2"],
    ["-pp", "2", "-tp", "3"], ["-dp", "y", "-tp", "2", "-pp", "2"],
    # Without -pp: pipeline 1, -tp x -dp against the GPUs.
    ["-tp", "2", "-dp", "2"], ["-dp=4", "-tp", "2"], ["-tp", "3", "-dp", "2"],
    ["-tp", "1", "-dp", "8"],
]  # fmt: skip


@pytest.mark.parametrize("words", PIPELINE_WORDS, ids=" ".join)
@pytest.mark.parametrize("tensor_parallel", [None, 2])
@pytest.mark.parametrize("count", [1, 2, 4, 8])
def test_the_pipeline_rule_gives_its_python_twins_verdict(
    kube: Kube, namespace: str, words: list[str], tensor_parallel: int | None, count: int
) -> None:
    """tensor x pipeline x data parallel against the GPUs, in CEL and in Python alike, for each
    way the tensor size is given (extraArgs, runtime.tensorParallel, or following -pp), and
    without -pp."""
    runtime: dict[str, Any] = {"gpu": {"type": "H100", "count": count}, "extraArgs": words}
    if tensor_parallel is not None:
        runtime["tensorParallel"] = tensor_parallel
    document = {**BASE, "spec": {**BASE["spec"], "runtime": runtime}}
    found = [p.message for p in validation.problems(document)]
    result = kube.run("apply", "--server-side", "--dry-run=server", "-n", namespace, "-f", "-",
                      stdin=json.dumps(document))  # fmt: skip
    assert (result.returncode == 0) == (found == []), (runtime, found, result.stderr)
    assert [m for m in found if m not in result.stderr] == [], (runtime, result.stderr)


IMAGE_SHAPES = {
    # shape -> the image with a path part of n characters
    "hub-one-part": lambda n: "a" * n,
    "hub-one-part-tagged": lambda n: "a" * n + ":v1",
    "hub-org": lambda n: "org/" + "a" * n + "@sha256:" + "f" * 64,
    "docker-io-one-part": lambda n: "docker.io/" + "a" * n,
    "legacy-hub-one-part": lambda n: "index.docker.io/" + "a" * n + ":v1",
    "legacy-hub-org": lambda n: "index.docker.io/org/" + "a" * n,
    "registry-with-port": lambda n: "localhost:5000/" + "a" * n + ":1.0",
    "localhost": lambda n: "localhost/" + "a" * n,
}


@pytest.mark.parametrize("over", [0, 1], ids=["at-the-limit", "one-over"])
@pytest.mark.parametrize("shape", IMAGE_SHAPES)
def test_the_image_name_rule_gives_its_python_twins_verdict(
    kube: Kube, namespace: str, shape: str, over: int
) -> None:
    """The kubelet's 255 characters of a normalized name, in CEL and in Python, at the limit
    and one past it, for each way a reference names (or leaves out) its registry."""
    make = IMAGE_SHAPES[shape]
    n = next(n for n in range(1, 300) if image_name_length(make(n)) == IMAGE_NAME_MAX) + over
    document = changed({"runtime.image": make(n)})
    found = [p.message for p in validation.problems(document)]
    assert (found != []) == (over == 1), found
    result = kube.run("apply", "--server-side", "--dry-run=server", "-n", namespace, "-f", "-",
                      stdin=json.dumps(document))  # fmt: skip
    assert (result.returncode == 0) == (found == []), (make(n), found, result.stderr)
    assert [m for m in found if m not in result.stderr] == [], result.stderr


def test_an_annotation_an_older_release_let_in_does_not_block_updates(
    kube: Kube, namespace: str
) -> None:
    """The policy ratchets: an object that holds a rollout-pause value from before the policy
    (made here by turning the binding to Audit for a moment) can still be updated, by the
    operator or anyone, while the value stays; changing it to another wrong value is refused."""
    name, policy = "ratchet", f"validatingadmissionpolicybinding/{admission_policy.POLICY_NAME}"
    document = changed({"metadata.name": name, "metadata.annotations": {ROLLOUT_PAUSE: "true"}})
    kube.kubectl("apply", "--server-side", "-n", namespace, "-f", "-", stdin=json.dumps(document))
    target = (f"inferenceservices.llmfleet.dev/{name}", "-n", namespace)

    def annotate(value: str, *dry_run: str) -> Any:
        return kube.run("annotate", *dry_run, "--overwrite", *target, f"{ROLLOUT_PAUSE}={value}")

    def actions(value: str) -> None:
        patch = json.dumps({"spec": {"validationActions": [value]}})
        kube.kubectl("patch", policy, "--type=merge", "-p", patch)

    try:
        actions("Audit")
        kube.wait_for(lambda: annotate("yes").returncode == 0, timeout=60, what="Audit in force")
        actions("Deny")
        kube.wait_for(lambda: annotate("no", "--dry-run=server").returncode != 0, timeout=60,
                      what="Deny in force again")  # fmt: skip
        assert annotate("maybe").returncode != 0
        assert kube.get(*target)["metadata"]["annotations"][ROLLOUT_PAUSE] == "yes"
        updated = kube.run("label", *target, "team=llm")
        assert updated.returncode == 0, updated.stderr
        assert annotate("false").returncode == 0
    finally:
        actions("Deny")
        kube.run("delete", *target, "--wait=false")


def _ratcheting_messages() -> set[str]:
    """The messages of every rule that ratchets (`Rule.ratchets`), from the models."""
    found: set[str] = set()
    pending: list[type[ApiModel]] = [ApiModel]
    while pending:
        model = pending.pop()
        pending += model.__subclasses__()
        found |= {rule.message for rule in model.rules if rule.ratchets}
    return found


def _without_rules(node: Any, messages: set[str]) -> Any:
    """A CRD document with the rules of `messages` left out, as a release before them had it."""
    if isinstance(node, dict):
        kept = {key: _without_rules(value, messages) for key, value in node.items()}
        if "x-kubernetes-validations" in kept:
            kept["x-kubernetes-validations"] = [
                rule for rule in kept["x-kubernetes-validations"]
                if rule["message"] not in messages
            ]  # fmt: skip
            if not kept["x-kubernetes-validations"]:
                del kept["x-kubernetes-validations"]
        return kept
    if isinstance(node, list):
        return [_without_rules(item, messages) for item in node]
    return node


def test_an_option_of_an_unchosen_mode_an_older_crd_let_in_does_not_block_updates(
    kube: Kube, namespace: str
) -> None:
    """The rules on options of a mode the spec does not choose ratchet (CRD validation
    ratcheting): an object stored by a CRD without them (made here by applying the CRD with
    those rules left out, then the real one again) can still be updated on another field, while
    a new object like it, or a change to the options' own object, is refused."""
    messages = _ratcheting_messages()
    assert len(messages) >= 7, messages
    name, target = "ratchet-mode", ("inferenceservices.llmfleet.dev/ratchet-mode", "-n", namespace)
    old = changed({"metadata.name": name, "rollout": {"steps": [{"weight": 10}]},
                   "traffic": {"debounce": {"windowMs": 1000}}})  # fmt: skip
    other = json.dumps({**old, "metadata": {"name": "ratchet-mode-new"}})
    real = yaml.safe_load(render.CRD_FILE.read_text())
    older = json.dumps(_without_rules(real, messages))

    def create_dry_run() -> Any:
        return kube.run("create", "--dry-run=server", "-n", namespace, "-f", "-", stdin=other)

    try:
        kube.kubectl("apply", "--server-side", "--force-conflicts",
                     "--field-manager=llmfleet-tests", "-f", "-", stdin=older)  # fmt: skip
        kube.wait_for(lambda: create_dry_run().returncode == 0, timeout=60,
                      what="the CRD without the rules in force")  # fmt: skip
        kube.kubectl("create", "-n", namespace, "-f", "-", stdin=json.dumps(old))
    finally:
        kube.kubectl("apply", "--server-side", "--force-conflicts",
                     "--field-manager=llmfleet-tests", "-f", str(render.CRD_FILE))  # fmt: skip
    try:
        refused = kube.wait_for(lambda: (r := create_dry_run()).returncode != 0 and r,
                                timeout=60, what="the real CRD in force again")  # fmt: skip
        assert "rollout.steps are a canary's" in refused.stderr, refused.stderr
        assert "debounce.windowMs acts only with debounce.mode LatestWins" in refused.stderr
        # Another field changes: the options' objects are as they were, so the update passes.
        patch = json.dumps({"spec": {"model": {"maxModelLen": 4096}}})
        updated = kube.run("patch", *target, "--type=merge", "-p", patch)
        assert updated.returncode == 0, updated.stderr
        labelled = kube.run("label", *target, "team=llm")
        assert labelled.returncode == 0, labelled.stderr
        stored = kube.get(*target)["spec"]
        assert stored["model"]["maxModelLen"] == 4096
        assert stored["rollout"]["steps"] == [{"weight": 10, "pauseSeconds": 300}]
        # A change to the steps themselves is checked: still no Canary, so refused.
        steps = json.dumps({"spec": {"rollout": {"steps": [{"weight": 20}]}}})
        changed_steps = kube.run("patch", *target, "--type=merge", "-p", steps)
        assert changed_steps.returncode != 0
        assert "rollout.steps are a canary's" in changed_steps.stderr, changed_steps.stderr
        # Choosing the mode, the stored options become valid.
        modes = {"rollout": {"strategy": "Canary"}, "traffic": {"debounce": {"mode": "LatestWins"}}}
        canary = json.dumps({"spec": modes})
        chosen = kube.run("patch", *target, "--type=merge", "-p", canary)
        assert chosen.returncode == 0, chosen.stderr
    finally:
        kube.run("delete", *target, "--wait=false")
