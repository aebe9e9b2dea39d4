"""The engine pod as tables: model cache and source volumes, /dev/shm, env from Secrets, the
security contexts, pull secrets and resources (issue 27, item 1)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmfleet.crds import InferenceService
from llmfleet.crds.gpus import GPU_TYPES
from llmfleet.operator import engine_pod
from llmfleet.operator.children import config_map, deployment, runtime_config
from llmfleet.operator.settings import OperatorSettings

SETTINGS = OperatorSettings()


def service(model: dict[str, Any] | None = None, **runtime: Any) -> InferenceService:
    return InferenceService.model_validate(
        {
            "metadata": {"name": "svc", "namespace": "team", "uid": "u-1"},
            "spec": {"model": {"name": "org/model", **(model or {})}, "runtime": runtime},
        }
    )


def pod(svc: InferenceService, settings: OperatorSettings = SETTINGS) -> dict[str, Any]:
    spec: dict[str, Any] = deployment(svc, "unified", 1, settings)["spec"]["template"]["spec"]
    return spec


def container(svc: InferenceService, settings: OperatorSettings = SETTINGS) -> dict[str, Any]:
    [engine] = pod(svc, settings)["containers"]
    return dict(engine)


def volume(svc: InferenceService, name: str) -> dict[str, Any] | None:
    return next((v for v in pod(svc)["volumes"] if v["name"] == name), None)


def mounts(svc: InferenceService) -> dict[str, dict[str, Any]]:
    return {m["mountPath"]: m for m in container(svc)["volumeMounts"]}


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ({}, {"name": "model-cache", "emptyDir": {}}),
        (
            {"cache": {"sizeLimit": "40Gi"}},
            {"name": "model-cache", "emptyDir": {"sizeLimit": "40Gi"}},
        ),
        (
            {"cache": {"claimName": "hub-cache"}},
            {"name": "model-cache", "persistentVolumeClaim": {"claimName": "hub-cache"}},
        ),
    ],
    ids=["emptyDir by default", "emptyDir with a size limit", "a shared claim"],
)
def test_the_model_cache_is_hf_home(model: dict[str, Any], expected: dict[str, Any]) -> None:
    svc = service(model)
    assert volume(svc, "model-cache") == expected
    assert mounts(svc)[engine_pod.MODEL_CACHE_DIR]["name"] == "model-cache"
    env = {var["name"]: var.get("value") for var in container(svc)["env"]}
    assert env["HF_HOME"] == engine_pod.MODEL_CACHE_DIR


@pytest.mark.parametrize(
    ("source", "claim"),
    [
        ("pvc://weights/llama/8b", "weights"),
        ("pvc://weights", "weights"),
        ("hf://org/other", None),
        (None, None),
        ("s3://bucket/model", None),
    ],
    ids=["pvc with a path", "pvc root", "hf", "none", "s3"],
)
def test_a_pvc_source_is_mounted_read_only(source: str | None, claim: str | None) -> None:
    svc = service({"source": source} if source else {})
    found = volume(svc, "model-source")
    if claim is None:
        assert found is None
        assert not any(p.startswith(engine_pod.MODEL_SOURCE_DIR) for p in mounts(svc))
        return
    assert found == {
        "name": "model-source",
        "persistentVolumeClaim": {"claimName": claim, "readOnly": True},
    }
    mount = mounts(svc)[f"{engine_pod.MODEL_SOURCE_DIR}/{claim}"]
    assert mount == {"name": "model-source", "mountPath": mount["mountPath"], "readOnly": True}


@pytest.mark.parametrize(
    ("runtime", "size"),
    [
        ({}, "2Gi"),
        ({"gpu": {"type": "H100", "count": 8}}, "16Gi"),
        ({"gpu": {"type": "H100", "count": 4}, "shmSize": "10Gi"}, "10Gi"),
    ],
    ids=["1 GPU", "8 GPUs", "override"],
)
def test_dev_shm_is_memory_sized_for_the_gpus(runtime: dict[str, Any], size: str) -> None:
    svc = service(**runtime)
    assert volume(svc, "dshm") == {
        "name": "dshm",
        "emptyDir": {"medium": "Memory", "sizeLimit": size},
    }
    assert mounts(svc)["/dev/shm"]["name"] == "dshm"


def test_every_writable_place_is_an_empty_dir_under_a_read_only_root() -> None:
    svc = service()
    engine = container(svc)
    assert engine["securityContext"]["readOnlyRootFilesystem"] is True
    writable = {path for path, m in mounts(svc).items() if not m.get("readOnly")}
    assert writable == {"/home/llmfleet", "/tmp", engine_pod.MODEL_CACHE_DIR, "/dev/shm"}
    env = {var["name"]: var.get("value") for var in engine["env"]}
    assert env["HOME"] == "/home/llmfleet"


def test_the_security_contexts_are_pod_security_restricted() -> None:
    spec = pod(service(), OperatorSettings(engine_user_id=2000))
    assert spec["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 2000,
        "runAsGroup": 2000,
        "fsGroup": 2000,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert spec["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert spec["automountServiceAccountToken"] is False
    assert not any("hostPath" in v for v in spec["volumes"])


SECRET_REF = {"secretKeyRef": {"name": "hf", "key": "token"}}


def test_env_from_a_secret_stays_a_reference_and_never_enters_the_config_map() -> None:
    svc = service(
        env=[
            {"name": "HF_TOKEN", "valueFrom": SECRET_REF},
            {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode"}}},
            {"name": "PLAIN", "value": "1"},
        ],
        envFrom=[{"secretRef": {"name": "s3-credentials"}, "prefix": "AWS_"}],
    )
    engine = container(svc)
    env = {var["name"]: var for var in engine["env"]}
    assert env["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": SECRET_REF}
    assert env["MODE"] == {
        "name": "MODE",
        "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode"}},
    }
    assert env["PLAIN"] == {"name": "PLAIN", "value": "1"}
    assert engine["envFrom"] == [{"secretRef": {"name": "s3-credentials"}, "prefix": "AWS_"}]
    text = json.dumps(config_map(svc)) + json.dumps(runtime_config(svc, "unified"))
    for word in ("HF_TOKEN", "PLAIN", "s3-credentials", "envFrom", '"env"'):
        assert word not in text


@pytest.mark.parametrize(
    ("given", "value"),
    [
        ({"name": "HOME", "value": "/data/home"}, "/data/home"),
        ({"name": "HF_HOME", "value": "/data/hf"}, "/data/hf"),
    ],
    ids=["HOME replaced", "HF_HOME replaced"],
)
def test_a_spec_env_entry_replaces_a_default(  # the operator's own names: refused at admission
    given: dict[str, str], value: str | None
) -> None:
    env = container(service(env=[given]))["env"]
    entries = [var for var in env if var["name"] == given["name"]]
    assert len(entries) == 1
    assert entries[0].get("value") == value


@pytest.mark.parametrize(
    ("runtime", "settings", "expected"),
    [
        ({}, SETTINGS, None),
        ({}, OperatorSettings(engine_image_pull_secrets=["ours"]), [{"name": "ours"}]),
        (
            {"imagePullSecrets": [{"name": "theirs"}]},
            OperatorSettings(engine_image_pull_secrets=["ours"]),
            [{"name": "theirs"}],
        ),
        ({"imagePullSecrets": []}, OperatorSettings(engine_image_pull_secrets=["o"]), None),
    ],
    ids=["none", "the operator's default", "the spec's win", "an empty list turns them off"],
)
def test_image_pull_secrets(
    runtime: dict[str, Any], settings: OperatorSettings, expected: list[dict[str, str]] | None
) -> None:
    assert pod(service(**runtime), settings).get("imagePullSecrets") == expected


@pytest.mark.parametrize(
    ("runtime", "requests", "limits"),
    [
        ({}, {"cpu": "8", "memory": "64Gi"}, {"memory": "64Gi"}),
        (
            {"gpu": {"type": "H200", "count": 8}},
            {"cpu": "64", "memory": "768Gi"},
            {"memory": "768Gi"},
        ),
        ({"gpu": {"type": "L4", "count": 2}}, {"cpu": "8", "memory": "48Gi"}, {"memory": "48Gi"}),
        (
            {"resources": {"requests": {"memory": "100Gi"}}},
            {"cpu": "8", "memory": "100Gi"},
            {"memory": "100Gi"},
        ),
        (
            {"resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "4", "memory": "80Gi"}}},
            {"cpu": "2", "memory": "64Gi"},
            {"cpu": "4", "memory": "80Gi"},
        ),
        # A limit written alone, below what the GPU type derives: the request follows it down.
        (
            {"resources": {"limits": {"cpu": "2", "memory": "16Gi"}}},
            {"cpu": "2", "memory": "16Gi"},
            {"cpu": "2", "memory": "16Gi"},
        ),
        (
            {"resources": {"limits": {"cpu": "32", "memory": "128Gi"}}},
            {"cpu": "8", "memory": "64Gi"},
            {"cpu": "32", "memory": "128Gi"},
        ),
    ],
    ids=[
        "H100 x1",
        "H200 x8",
        "L4 x2",
        "memory request",
        "cpu and limits",
        "limits alone below the derived requests",
        "limits alone above them",
    ],
)
def test_resources_derive_from_the_gpu_type_with_overrides(
    runtime: dict[str, Any], requests: dict[str, str], limits: dict[str, str]
) -> None:
    svc = service(**runtime)
    gpus = str(svc.spec.runtime.gpu.count)
    assert container(svc)["resources"] == {
        "requests": requests | {"nvidia.com/gpu": gpus},
        "limits": limits | {"nvidia.com/gpu": gpus},
    }


def test_every_gpu_type_has_cpu_and_memory_that_fit_a_node_of_eight() -> None:
    """The fake nodes of the local cluster have 16 CPUs and 128 GiB per GPU; a real GPU node
    of each type has more (engine_pod.py says which)."""
    for name in GPU_TYPES:
        assert engine_pod.CPU_PER_GPU[name] <= 16
        assert engine_pod.MEMORY_GIB_PER_GPU[name] + engine_pod.SHM_GIB_PER_GPU <= 128
