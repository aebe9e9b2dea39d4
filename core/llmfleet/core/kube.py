"""Kubernetes client helpers shared by the components."""

from __future__ import annotations

from kubernetes import client, config


def api_client(kubeconfig: str | None = None) -> client.ApiClient:
    """A client for `kubeconfig`, else the in-cluster config, else `$KUBECONFIG`/~/.kube/config.

    Raises `kubernetes.config.ConfigException` when none of them is there.
    """
    if kubeconfig:
        api: client.ApiClient = config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
        return api
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]
    return client.ApiClient()
