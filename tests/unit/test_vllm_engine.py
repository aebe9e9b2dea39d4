"""`llmfleet up --engine vllm-cpu`: the claim that hands vLLM's CPU build to the sample's pod,
the sample itself as admission reads it, and what `up` refuses. (e2e/test_real_vllm.py runs it
on the real node.)"""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmfleet.core.images import vllm_cpu
from llmfleet.core.local import control, layout, vllm_engine
from llmfleet.crds.inference_service import InferenceService
from llmfleet.operator import engine_pod


def test_the_volume_is_the_build_directory_on_the_real_node_bound_to_the_claim() -> None:
    volume, claim = vllm_engine.manifests(Path("/cache/vllm-cpu/0.32.0-abc"), "node-1", "team")
    assert volume["kind"] == "PersistentVolume"
    assert volume["spec"]["local"] == {"path": "/cache/vllm-cpu/0.32.0-abc"}
    terms = volume["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    assert terms == [
        {
            "matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-1"]}
            ]
        }
    ]
    # Bound both ways, statically (no provisioner), read-only for every pod of the service.
    assert volume["spec"]["claimRef"] == {"namespace": "team", "name": vllm_engine.CLAIM}
    assert claim["spec"]["volumeName"] == volume["metadata"]["name"] == "llmfleet-vllm-cpu-team"
    assert claim["metadata"] == {"name": vllm_engine.CLAIM, "namespace": "team"}
    for manifest in (volume, claim):
        assert manifest["spec"]["accessModes"] == ["ReadOnlyMany"]
        assert manifest["spec"]["storageClassName"] == ""


def _sample() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(vllm_engine.SAMPLE.read_text())
    return loaded


def test_the_sample_mounts_the_claim_and_runs_the_venv_on_it() -> None:
    """The sample's pod, as the operator renders it: the claim read-only where the sample's
    LLMFLEET_VLLM_VENV points, the launcher told it runs on the CPU, and only volumes Pod
    Security `restricted` allows."""
    service = InferenceService.model_validate(_sample())
    assert service.spec.model.served_name == vllm_engine.SERVED_NAME
    claim, path = engine_pod.pvc_source(service) or ("", "")
    assert (claim, path) == (vllm_engine.CLAIM, "model")
    env = {entry.name: entry.value for entry in service.spec.runtime.env}
    assert env["LLMFLEET_RUNTIME_GPU"] == "CPU"
    # Engines sharing a node without CPU pinning: each would bind its OpenMP threads to core 0.
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    assert env["OMP_NUM_THREADS"] == "1"
    mount = next(m for m in engine_pod.volume_mounts(service) if m["name"] == "model-source")
    assert mount["readOnly"] is True
    assert env["LLMFLEET_VLLM_VENV"] == f"{mount['mountPath']}/venv"
    restricted = {"persistentVolumeClaim", "emptyDir", "configMap", "secret", "projected"}
    for volume in engine_pod.volumes(service):
        kinds = set(volume) - {"name"}
        assert kinds <= restricted, volume


def test_up_refuses_vllm_cpu_without_a_real_node_and_unknown_engines() -> None:
    with pytest.raises(control.LocalSystemError, match="leave out --no-real-node"):
        control._real_engine("vllm-cpu", real_node=False, say=print)
    with pytest.raises(control.LocalSystemError, match="one of simulator, vllm-cpu"):
        control._real_engine("tgi", real_node=True, say=print)
    assert control._real_engine("simulator", real_node=True, say=print) is None


def test_install_binds_the_claim_then_applies_the_services(tmp_path: Path) -> None:
    calls: list[tuple[tuple[str, ...], str | None]] = []

    def kubectl(*args: str, stdin: str | None = None) -> str:
        calls.append((args, stdin))
        return "node-1" if args[:2] == ("get", "nodes") else ""

    (tmp_path / "model").mkdir()
    weights = tmp_path / "model" / "model.safetensors"
    weights.write_text("weights")
    weights.chmod(0o600)  # as safetensors writes it
    vllm_engine.install(kubectl, tmp_path, services=layout.SAMPLES)
    assert calls[0][0][:2] == ("get", "nodes")
    listed = json.loads(calls[1][1] or "{}")
    assert [item["kind"] for item in listed["items"]] == [
        "PersistentVolume",
        "PersistentVolumeClaim",
    ]
    assert calls[2][0] == ("apply", "-f", str(layout.SAMPLES))
    # The pod's user (10001) reads the weights from the volume.
    assert stat.S_IMODE(weights.stat().st_mode) & 0o004


def test_sharing_the_model_is_idempotent_and_only_adds_read(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir(mode=0o700)
    weights = folder / "w.bin"
    weights.write_text("x")
    weights.chmod(0o600)
    for _ in range(2):
        vllm_cpu.share(tmp_path)
    assert stat.S_IMODE(weights.stat().st_mode) == 0o644
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755
