"""Kubernetes client helpers shared by the components."""

from __future__ import annotations

from kubernetes import client, config

from llmfleet.core import loopback


def api_client(kubeconfig: str | None = None) -> client.ApiClient:
    """A client for `kubeconfig`, else the in-cluster config, else `$KUBECONFIG`/~/.kube/config.

    Raises `kubernetes.config.ConfigException` when none of them is there, and
    `loopback.NonLocalRefused` when `LLMFLEET_LOOPBACK_ONLY` is on and the API server is not on
    loopback (the local cluster's always is).
    """
    if kubeconfig:
        api: client.ApiClient = config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    else:
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        except config.ConfigException:
            config.load_kube_config()  # type: ignore[no-untyped-call]
        api = client.ApiClient()
    loopback.LoopbackGuard(loopback.enabled()).check_url(api.configuration.host, "kubernetes")
    return api
