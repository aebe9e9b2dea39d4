"""Read the API-keys document from a Kubernetes Secret (key `tenants.yaml`)."""

from __future__ import annotations

import base64

from llmfleet.gateway.tenants import TenantsError

SECRET_KEY = "tenants.yaml"


def read_keys_secret(reference: str, kubeconfig: str | None = None) -> str:
    """The `tenants.yaml` of Secret `NAMESPACE/NAME`; TenantsError (one line) when unreadable."""
    from kubernetes import client, config  # noqa: PLC0415 - only this source needs the client
    from kubernetes.client.exceptions import ApiException  # noqa: PLC0415

    from llmfleet.core.kube import api_client  # noqa: PLC0415

    namespace, _, name = reference.partition("/")
    if not namespace or not name:
        raise TenantsError(f"--api-keys-secret must be NAMESPACE/NAME, got {reference!r}")
    try:
        api = client.CoreV1Api(api_client(kubeconfig, component="gateway"))
        secret = api.read_namespaced_secret(name, namespace)
    except (ApiException, config.ConfigException) as error:
        reason = getattr(error, "reason", None) or error
        raise TenantsError(f"cannot read Secret {reference}: {reason}") from None
    data = secret.data or {}
    if SECRET_KEY not in data:
        raise TenantsError(f"Secret {reference} has no `{SECRET_KEY}` key")
    return base64.b64decode(data[SECRET_KEY]).decode()
