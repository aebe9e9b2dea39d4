"""The pure plan: children of each sample, pod template details, targets and conditions."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
import yaml

from llmfleet.crds import InferenceService
from llmfleet.crds import labels as L
from llmfleet.crds.inference_service import AutoscalingStatus
from llmfleet.operator.observed import Observed, ObservedPod
from llmfleet.operator.plan import desired, targets
from llmfleet.operator.pools import COST_SERVING
from llmfleet.operator.settings import OperatorSettings
from tests.crds.cases import SAMPLES_DIR

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
SETTINGS = OperatorSettings(drain_seconds=90)


def load(sample: str) -> InferenceService:
    manifest = yaml.safe_load((SAMPLES_DIR / f"{sample}.yaml").read_text())
    manifest["metadata"].update(namespace="team", uid="uid-1", generation=3)
    return InferenceService.model_validate(manifest)


def kinds(objects: tuple[dict[str, Any], ...]) -> list[str]:
    return sorted(f"{o['kind']}/{o['metadata']['name']}" for o in objects)


@pytest.mark.parametrize(
    ("sample", "expected"),
    [
        ("unified", ["ConfigMap/llama-8b-runtime", "Deployment/llama-8b-unified",
                     "NetworkPolicy/llama-8b-engines",
                     "PodDisruptionBudget/llama-8b-unified", "Service/llama-8b-metrics",
                     "Service/llama-8b-unified"]),
        ("disaggregated", ["ConfigMap/llama-70b-pd-runtime", "Deployment/llama-70b-pd-decode",
                           "Deployment/llama-70b-pd-prefill",
                           "NetworkPolicy/llama-70b-pd-engines",
                           "PodDisruptionBudget/llama-70b-pd-decode",
                           "PodDisruptionBudget/llama-70b-pd-prefill",
                           "Service/llama-70b-pd-decode", "Service/llama-70b-pd-metrics",
                           "Service/llama-70b-pd-prefill"]),
    ],
)  # fmt: skip
def test_children_per_sample(sample: str, expected: list[str]) -> None:
    plan = desired(load(sample), Observed(), SETTINGS, NOW)
    assert kinds(plan.objects) == expected
    for obj in plan.objects:
        owner = obj["metadata"]["ownerReferences"][0]
        assert owner["uid"] == "uid-1"
        assert owner["controller"] is True


def test_service_monitor_only_when_its_crd_exists() -> None:
    plan = desired(load("unified"), Observed(service_monitor_crd=True), SETTINGS, NOW)
    assert "ServiceMonitor/llama-8b-metrics" in kinds(plan.objects)


def test_deployment_pod_template() -> None:
    plan = desired(load("disaggregated"), Observed(), SETTINGS, NOW)
    deployment = next(o for o in plan.objects if o["metadata"]["name"] == "llama-70b-pd-prefill")
    pod = deployment["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert container["command"][:2] == ["llmfleet-runtime", "serve"]
    assert container["command"][-1].endswith("/prefill.json")
    assert {"readinessProbe", "livenessProbe", "startupProbe"} <= set(container)
    spec_env = {env.name for env in load("disaggregated").spec.runtime.env}
    # Admission refuses in spec.runtime.env exactly the names the operator sets (besides the
    # defaults a spec entry may replace).
    defaults = {"HOME", "HF_HOME", "PYTHONDONTWRITEBYTECODE"}
    assert {env["name"] for env in container["env"]} - spec_env - defaults == set(L.OPERATOR_ENV)
    pod_ip = next(env for env in container["env"] if env["name"] == "POD_IP")
    assert pod_ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    term = {
        "key": "nvidia.com/gpu.product",
        "operator": "In",
        "values": ["NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe", "NVIDIA-H100-NVL"],
    }
    affinity = pod["spec"]["affinity"]["nodeAffinity"]
    affinity = affinity["requiredDuringSchedulingIgnoredDuringExecution"]
    assert affinity == {"nodeSelectorTerms": [{"matchExpressions": [term]}]}
    assert pod["spec"]["nodeSelector"] == {}
    assert pod["spec"]["terminationGracePeriodSeconds"] >= SETTINGS.drain_seconds
    assert pod["metadata"]["labels"][L.SERVING] == "false"
    service = next(
        o
        for o in plan.objects
        if o["kind"] == "Service" and o["metadata"]["name"] == "llama-70b-pd-prefill"
    )
    assert service["spec"]["selector"][L.SERVING] == "true"


def _child(kind: str, name: str) -> dict[str, Any]:
    plan = desired(load("disaggregated"), Observed(service_monitor_crd=True), SETTINGS, NOW)
    return next(o for o in plan.objects if (o["kind"], o["metadata"]["name"]) == (kind, name))


def _engine_container() -> dict[str, Any]:
    deployment = _child("Deployment", "llama-70b-pd-decode")
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


def test_the_pod_has_vllms_port_and_the_launchers_side_port() -> None:
    ports = {p["name"]: p["containerPort"] for p in _engine_container()["ports"]}
    assert ports == {"http": L.ENGINE_PORT, "launcher": L.LAUNCHER_PORT}


@pytest.mark.parametrize(
    ("hook", "path", "port"),
    [
        pytest.param("readinessProbe", "/ready", "launcher", id="ready-after-warm-up-until-drain"),
        pytest.param("livenessProbe", "/health", "http", id="liveness-is-vllms-health"),
        pytest.param("startupProbe", "/health", "http", id="startup-waits-for-vllm"),
        pytest.param("preStop", "/drain", "launcher", id="pre-stop-drains"),
    ],
)  # fmt: skip
def test_probes_and_the_pre_stop_hook(hook: str, path: str, port: str) -> None:
    container = _engine_container()
    handler = container["lifecycle"][hook] if hook == "preStop" else container[hook]
    assert handler["httpGet"] == {"path": path, "port": port}


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("llama-70b-pd-prefill", id="prefill-pool"),
        pytest.param("llama-70b-pd-decode", id="decode-pool"),
        pytest.param("llama-70b-pd-metrics", id="metrics"),
    ],
)
def test_services_target_vllm_itself(name: str) -> None:
    # The port keeps the name `http`: EndpointSlices carry it, and the gateway looks it up.
    [port] = _child("Service", name)["spec"]["ports"]
    assert port == {"name": "http", "port": L.ENGINE_PORT, "targetPort": "http"}


def test_prometheus_scrapes_vllm_itself() -> None:
    [endpoint] = _child("ServiceMonitor", "llama-70b-pd-metrics")["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("http", "/metrics")


def test_runtime_config_changes_roll_the_pods() -> None:
    before = desired(load("unified"), Observed(), SETTINGS, NOW)
    changed = load("unified").model_copy(deep=True)
    manifest = changed.model_dump(by_alias=True)
    manifest["spec"]["runtime"]["maxNumSeqs"] = 64
    after = desired(InferenceService.model_validate(manifest), Observed(), SETTINGS, NOW)

    def config_hash(plan: Any) -> str:
        deployment = next(o for o in plan.objects if o["kind"] == "Deployment")
        return str(deployment["spec"]["template"]["metadata"]["annotations"][L.CONFIG_HASH])

    assert config_hash(before) != config_hash(after)


def test_autoscaler_decision_is_obeyed_within_min_and_max() -> None:
    service = load("spares")  # min 1, max 4, 1 warm spare, autoscaling on
    decide = {"pools": {"unified": {"active": 9, "spares": 2, "reason": "burst"}}}
    observed = Observed(autoscaling=AutoscalingStatus.model_validate(decide))
    chosen = targets(service, observed, NOW, SETTINGS.drain_seconds)
    assert (chosen["unified"].active, chosen["unified"].spares) == (4, 2)
    assert chosen["unified"].source == "autoscaler"
    assert targets(service, Observed(), NOW, SETTINGS.drain_seconds)["unified"].active == 1


def test_insufficient_gpu_condition() -> None:
    pending = ObservedPod(
        name="p", pool="unified", created=NOW, ready=False, serving=False,
        unschedulable="0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
    )  # fmt: skip
    plan = desired(load("unified"), Observed(pods=(pending,)), SETTINGS, NOW)
    conditions = {c["type"]: c for c in plan.status["conditions"]}  # type: ignore[attr-defined]
    assert conditions["Ready"]["status"] == "False"
    assert conditions["Ready"]["reason"] == "InsufficientGPU"
    assert "Add GPU nodes" in conditions["Ready"]["message"]
    assert conditions["Degraded"]["status"] == "True"
    assert any(event.reason == "InsufficientGPU" and event.warning for event in plan.events)


H100 = "NVIDIA-H100-80GB-HBM3"
H200 = "NVIDIA-H200"
SELECTOR_MISS = "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."


@pytest.mark.parametrize(
    ("products", "scheduler", "reason", "said"),
    [
        pytest.param((H100, H100), SELECTOR_MISS, "NoMatchingGPUNodes",
                     ["No node has H200 GPUs (nvidia.com/gpu.product one of NVIDIA-H200, "
                      "NVIDIA-H200-NVL)",
                      f"H100 (nvidia.com/gpu.product={H100}) on 2 node(s)",
                      "Set spec.runtime.gpu.type to H100, or add nodes with H200 GPUs."],
                     id="only-other-gpu-types"),
        pytest.param((H100, "NVIDIA-A100-SXM4-80GB", "NVIDIA-L4"), SELECTOR_MISS,
                     "NoMatchingGPUNodes", ["Set spec.runtime.gpu.type to one of H100, A100, L4"],
                     id="several-types-to-choose-from"),
        pytest.param((), SELECTOR_MISS, "NoMatchingGPUNodes",
                     ["No node has H200 GPUs", "the cluster has no GPU nodes",
                      "Add nodes with H200 GPUs."],
                     id="no-gpu-nodes"),
        pytest.param(("NVIDIA-GH200-480GB",), SELECTOR_MISS, "NoMatchingGPUNodes",
                     ["NVIDIA-GH200-480GB (nvidia.com/gpu.product=NVIDIA-GH200-480GB) on 1",
                      "node(s). Add nodes with H200 GPUs."], id="only-unknown-products"),
        pytest.param((H100, H200), "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, "
                     "1 node(s) didn't match Pod's node affinity/selector.", "InsufficientGPU",
                     ["need 1 x H200 GPU each"], id="h200-nodes-full"),
        pytest.param(None, SELECTOR_MISS, "Unschedulable", ["didn't match"],
                     id="nodes-unknown-scheduler-words"),
    ],
)  # fmt: skip
def test_a_gpu_type_no_node_has_is_named_with_what_to_do(
    products: tuple[str, ...] | None, scheduler: str, reason: str, said: list[str]
) -> None:
    pending = ObservedPod(
        name="p", pool="unified", created=NOW, ready=False, serving=False, unschedulable=scheduler
    )
    observed = Observed(pods=(pending,), gpu_node_products=products)
    plan = desired(load("slo"), observed, SETTINGS, NOW)  # asks for H200
    conditions = {c["type"]: c for c in plan.status["conditions"]}  # type: ignore[attr-defined]
    ready, degraded = conditions["Ready"], conditions["Degraded"]
    print(f"{ready['reason']}: {ready['message']}")
    assert (ready["status"], ready["reason"]) == ("False", reason)
    assert (degraded["status"], degraded["reason"]) == ("True", reason)
    for words in said:
        assert words in ready["message"]
    assert any(event.reason == reason and event.warning for event in plan.events)


def test_ready_when_every_pool_serves_and_status_counts() -> None:
    pods = tuple(
        ObservedPod(
            name=f"p{i}",
            pool="unified",
            created=NOW,
            ready=True,
            serving=True,
            deletion_cost=COST_SERVING,
        )
        for i in range(2)
    )
    plan = desired(load("unified"), Observed(pods=pods), SETTINGS, NOW)
    status: Any = plan.status
    assert status["observedGeneration"] == 3
    assert status["serving"] == "unified 2/2"
    assert status["pools"]["unified"]["servingReplicas"] == 2
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "Serving")
    assert plan.requeue_after is None


def kstatus(plan: Any) -> tuple[str, str]:
    """What kstatus (Flux, cli-utils) reads: Reconciling and Stalled, abnormal when True."""
    said = {c["type"]: c["status"] for c in plan.status["conditions"]}
    return said["Reconciling"], said["Stalled"]


def test_kstatus_conditions_follow_ready_and_the_kind_of_problem() -> None:
    serving = tuple(
        ObservedPod(name=f"p{i}", pool="unified", created=NOW, ready=True, serving=True,
                    deletion_cost=COST_SERVING)
        for i in range(2)
    )  # fmt: skip
    starting = (ObservedPod(name="s", pool="unified", created=NOW, ready=False, serving=False),)
    full = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
    no_gpu = (ObservedPod(name="p", pool="unified", created=NOW, ready=False, serving=False,
                          unschedulable=full),)  # fmt: skip
    wrong_gpu = Observed(pods=(ObservedPod(name="p", pool="unified", created=NOW, ready=False,
                                           serving=False, unschedulable=SELECTOR_MISS),),
                         gpu_node_products=(H100,))  # fmt: skip
    assert kstatus(desired(load("unified"), Observed(pods=serving), SETTINGS, NOW)) == (
        "False", "False")  # fmt: skip
    assert kstatus(desired(load("unified"), Observed(pods=starting), SETTINGS, NOW)) == (
        "True", "False")  # fmt: skip
    # Waiting for GPUs may end by itself (a node joins, another service scales down).
    assert kstatus(desired(load("unified"), Observed(pods=no_gpu), SETTINGS, NOW)) == (
        "True", "False")  # fmt: skip
    # No node of that GPU type at all: someone has to change the spec or the cluster.
    assert kstatus(desired(load("slo"), wrong_gpu, SETTINGS, NOW)) == ("False", "True")
