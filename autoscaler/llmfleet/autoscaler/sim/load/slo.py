"""The SLO of the InferenceService that serves a model, read from the cluster (`--kubeconfig`).

`service_slo` is pure (the listed objects in, the SLO out); `read_slo` lists the services once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError
from urllib3.exceptions import HTTPError

from llmfleet.autoscaler.sim.load.stats import Slo
from llmfleet.core.errors import UserError
from llmfleet.core.kube import api_client
from llmfleet.crds.inference_service import GROUP, PLURAL, VERSION, InferenceServiceSpec


def service_slo(items: list[dict[str, Any]], model: str) -> tuple[str, Slo] | None:
    """`namespace/name` and SLO of the first service (by namespace, then name) whose served
    name is `model`; None when none serves it. A service whose spec does not validate is
    skipped (the operator reports it)."""

    def key(item: dict[str, Any]) -> tuple[str, str]:
        meta = item.get("metadata", {})
        return (str(meta.get("namespace", "")), str(meta.get("name", "")))

    for item in sorted(items, key=key):
        try:
            spec = InferenceServiceSpec.model_validate(item.get("spec", {}))
        except ValidationError:
            continue
        if spec.served_name == model:
            namespace, name = key(item)
            return f"{namespace}/{name}", Slo(spec.slo.ttft_p95_ms, spec.slo.itl_p95_ms)
    return None


def read_slo(kubeconfig: Path, model: str) -> tuple[str, Slo] | None:
    """`service_slo` over every InferenceService the cluster at `kubeconfig` has."""
    try:
        api = api_client(str(kubeconfig))
        listed: Any = client.CustomObjectsApi(api).list_cluster_custom_object(
            GROUP, VERSION, PLURAL
        )
    except (OSError, HTTPError, config.ConfigException, ApiException) as error:
        raise UserError(f"cannot list InferenceServices through {kubeconfig}: {error}") from None
    return service_slo(list(listed.get("items", [])), model)
