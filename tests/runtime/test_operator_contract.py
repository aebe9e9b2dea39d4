"""The contract with the operator: every pool config it renders for the e2e samples loads and
plans, with the ports, role and drain grace it meant; the pod it renders probes and stops the
launcher where the launcher answers.

The test imports the operator (tests sit outside the layer contracts; the launcher never does).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from llmfleet.crds import InferenceService
from llmfleet.crds.labels import ENGINE_PORT, LAUNCHER_PORT
from llmfleet.operator.children import deployment, runtime_config
from llmfleet.operator.settings import OperatorSettings
from llmfleet.runtime.args import plan_engine
from llmfleet.runtime.config import RuntimeConfig, Serving, load_config
from llmfleet.runtime.gpu import detect
from llmfleet.runtime.side_port import Gate, create_side_app
from tests.runtime.helpers import options_of

SAMPLES = Path(__file__).resolve().parents[2] / "e2e" / "samples"
RENDERED = [
    (sample.stem, pool)
    for sample in sorted(SAMPLES.glob("*.yaml"))
    for pool in InferenceService.model_validate(yaml.safe_load(sample.read_text())).spec.pools()
]


def _service(stem: str) -> InferenceService:
    manifest = yaml.safe_load((SAMPLES / f"{stem}.yaml").read_text())
    manifest["metadata"].update(namespace="team", uid="uid-1", generation=1)
    return InferenceService.model_validate(manifest)


@pytest.mark.parametrize(("stem", "pool"), RENDERED, ids=[f"{s}-{p}" for s, p in RENDERED])
def test_rendered_config_loads_and_plans(tmp_path: Path, stem: str, pool: str) -> None:
    service = _service(stem)
    path = tmp_path / f"{pool}.json"
    path.write_text(json.dumps(runtime_config(service, pool)))
    config = load_config(path, {"LLMFLEET_DRAIN_SECONDS": "90"})
    assert isinstance(config, RuntimeConfig)
    assert config.role.value == pool
    assert config.serving.port == ENGINE_PORT
    assert config.serving.launcher_port == LAUNCHER_PORT
    assert config.serving.drain_grace_seconds == 90
    plan = plan_engine(config, detect(config.runtime.gpu, {}), pod_ip="10.1.2.3")
    options = options_of(plan.argv)
    assert options["--served-model-name"] == service.spec.served_name
    assert options["--tensor-parallel-size"] == str(
        service.spec.runtime.tensor_parallel or service.spec.runtime.gpu.count
    )
    assert ("--kv-transfer-config" in options) == (pool != "unified")
    assert options["--port"] == str(ENGINE_PORT)
    assert options["--host"] == "0.0.0.0"


async def _no_drain() -> int | None:
    return 0


def test_the_pod_probes_and_stops_the_launcher_where_it_answers() -> None:
    service = _service("disaggregated")
    settings = OperatorSettings(drain_seconds=90)
    pod = deployment(service, "decode", 1, settings)["spec"]["template"]["spec"]
    [container] = pod["containers"]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    serving = Serving()
    assert ports == {"http": serving.port, "launcher": serving.launcher_port}
    side_paths = {route.path for route in create_side_app(Gate(), _no_drain).routes}  # type: ignore[attr-defined]
    readiness = container["readinessProbe"]["httpGet"]
    pre_stop = container["lifecycle"]["preStop"]["httpGet"]
    assert (readiness["port"], pre_stop["port"]) == ("launcher", "launcher")
    assert {readiness["path"], pre_stop["path"]} <= side_paths
    # The kubelet lets vLLM load as long as the launcher does, and waits out the drain.
    startup = container["startupProbe"]
    assert startup["httpGet"]["port"] == "http"
    assert startup["periodSeconds"] * startup["failureThreshold"] >= serving.startup_timeout_seconds
    grace = pod["terminationGracePeriodSeconds"]
    assert grace >= settings.drain_seconds + serving.engine_stop_seconds


def test_the_launcher_loads_a_pvc_source_where_the_operator_mounts_it(tmp_path: Path) -> None:
    manifest = yaml.safe_load((SAMPLES / "unified.yaml").read_text())
    manifest["metadata"].update(namespace="team", uid="uid-1")
    manifest["spec"]["model"]["source"] = "pvc://weights/llama/8b"
    service = InferenceService.model_validate(manifest)
    pod = deployment(service, "unified", 1, OperatorSettings())["spec"]["template"]["spec"]
    [container] = pod["containers"]
    [volume] = [v for v in pod["volumes"] if v.get("persistentVolumeClaim", {}).get("readOnly")]
    [mount] = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    assert volume["persistentVolumeClaim"]["claimName"] == "weights"
    path = tmp_path / "unified.json"
    path.write_text(json.dumps(runtime_config(service, "unified")))
    config = load_config(path, {})
    argv = plan_engine(config, detect(config.runtime.gpu, {})).argv
    assert argv[2] == f"{mount['mountPath']}/llama/8b"
    assert mount["readOnly"] is True
