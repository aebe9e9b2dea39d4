"""The real helm binary (the one the local cluster build caches) on charts/llmfleet."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from llmfleet.core.cluster import build

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "llmfleet"
VALUES_FULL = Path(__file__).with_name("values-full.yaml")
NAMESPACE = "llmfleet"
"""The release namespace of renders that name none."""
COMPONENTS = ("operator", "autoscaler", "gateway")


def helm_binary() -> Path:
    """helm from the cache (waits on a build running elsewhere; builds it where it may)."""
    return build.ensure_binary("helm")


def helm(
    *args: str, kubeconfig: Path | None = None, check: bool = True, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run helm; with `check`, a non-zero exit fails with helm's own stderr."""
    command = [str(helm_binary()), *args]
    if kubeconfig is not None:
        command += ["--kubeconfig", str(kubeconfig)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if check:
        assert result.returncode == 0, f"helm {' '.join(args)} failed:\n{result.stderr}"
    return result


NO_AUTH = {"gateway.auth": "none"}
"""What a render that gives no API keys adds: the chart requires keys unless told `none`."""


def value_args(values: Mapping[str, Any] | None = None, files: Sequence[Path] = ()) -> list[str]:
    """`-f FILE` for each file, then each of `values` (dotted path -> value) as `--set-json`.
    Values that say nothing of the gateway's keys (no `gateway.auth`, no `gateway.apiKeys…`,
    no file) get `gateway.auth: none` first, as a release without keys must say."""
    about_keys = any(key.startswith(("gateway.auth", "gateway.apiKeys")) for key in values or {})
    if not files and not about_keys and "gateway" not in (values or {}):
        values = {**NO_AUTH, **(values or {})}
    args = [arg for path in files for arg in ("-f", str(path))]
    for key, value in (values or {}).items():
        args += ["--set-json", f"{key}={json.dumps(value)}"]
    return args


def template(
    values: Mapping[str, Any] | None = None,
    files: Sequence[Path] = (),
    release: str = "t",
    namespace: str = NAMESPACE,
    api_versions: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """`helm template` of the chart: the rendered objects. `values` keys are dotted paths
    (`operator.settings`) set as JSON, after `files`."""
    extra = [arg for version in api_versions for arg in ("--api-versions", version)]
    result = helm(
        "template", release, str(CHART), "--namespace", namespace,
        *value_args(values, files), *extra,
    )  # fmt: skip
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def template_error(values: Mapping[str, Any], files: Sequence[Path] = ()) -> str:
    """helm's error for values the chart must refuse (fails when helm renders them)."""
    result = helm(
        "template", "t", str(CHART), "--namespace", NAMESPACE, *value_args(values, files),
        check=False,
    )  # fmt: skip
    assert result.returncode != 0, f"helm rendered values it should refuse: {values}"
    return result.stderr


def find(docs: Sequence[Mapping[str, Any]], kind: str, name: str | None = None) -> list[Any]:
    """Rendered objects of `kind` (and `name`)."""
    return [
        doc
        for doc in docs
        if doc["kind"] == kind and (name is None or doc["metadata"]["name"] == name)
    ]


def deployment(docs: Sequence[Mapping[str, Any]], component: str) -> dict[str, Any]:
    """The one Deployment of a component."""
    found = [
        doc
        for doc in find(docs, "Deployment")
        if doc["metadata"]["labels"].get("app.kubernetes.io/component") == component
    ]
    assert len(found) == 1, f"{len(found)} Deployments of the {component}"
    return dict(found[0])


def container_env(docs: Sequence[Mapping[str, Any]], component: str) -> dict[str, str]:
    """The component container's environment (every entry a plain value, none twice)."""
    container = deployment(docs, component)["spec"]["template"]["spec"]["containers"][0]
    env = container.get("env") or []
    names = [entry["name"] for entry in env]
    assert len(names) == len(set(names)), f"{component} sets a variable twice: {names}"
    assert all("value" in entry for entry in env), f"{component}: an env entry without a value"
    return {entry["name"]: entry["value"] for entry in env}
