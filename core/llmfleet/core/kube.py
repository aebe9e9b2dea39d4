"""Kubernetes client helpers shared by the components."""

from __future__ import annotations

import os
from importlib.metadata import version
from pathlib import Path

from kubernetes import client, config

from llmfleet.core import loopback
from llmfleet.core.errors import UserError

GET_A_CLUSTER = '`llmfleet cluster up` starts a local one; then `eval "$(llmfleet cluster env)"`'


def user_agent(component: str) -> str:
    """What `component` (operator, gateway, autoscaler) says it is in each request's User-Agent:
    `llmfleet-<component>/<version>`, so the API server's audit log tells the components apart
    (the Kubernetes client's own `OpenAPI-Generator/…` is the same for all of them)."""
    return f"llmfleet-{component}/{version('llmfleet')}"


def api_client(kubeconfig: str | None = None, *, component: str | None = None) -> client.ApiClient:
    """A client for `kubeconfig`, else the in-cluster config, else `$KUBECONFIG`/~/.kube/config;
    with `component`, its requests carry `user_agent(component)`.

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
    if component is not None:
        api.user_agent = user_agent(component)
    loopback.LoopbackGuard(loopback.enabled()).check_url(api.configuration.host, "kubernetes")
    return api


class NoKubeconfig(UserError):
    """No usable Kubernetes configuration, said in one line with where it was looked for."""


def connect(kubeconfig: str | None = None, *, component: str | None = None) -> client.ApiClient:
    """`api_client` for commands a person starts: a missing or unreadable configuration is a
    `NoKubeconfig` naming the file it looked at, instead of the client's traceback."""
    try:
        return api_client(kubeconfig, component=component)
    except loopback.NonLocalRefused as error:
        raise NoKubeconfig(f"cannot use the Kubernetes API server: {error}") from None
    except Exception as error:
        # NOTE: the client's loaders raise ConfigException for a missing or incomplete file,
        # yaml's errors for one that is not YAML, and TypeError or KeyError for YAML that is not a
        # kubeconfig; every one of them means this configuration cannot be used.
        raise NoKubeconfig(
            f"no Kubernetes cluster to talk to: {_looked_at(kubeconfig, error)} ({GET_A_CLUSTER})"
        ) from None


def _looked_at(kubeconfig: str | None, error: Exception) -> str:
    """Where the configuration was looked for, and what is wrong with it."""
    variable = os.environ.get("KUBECONFIG", "")
    if kubeconfig:
        where, names = kubeconfig, [kubeconfig]
    else:
        shown = f"KUBECONFIG={variable}" if variable else "~/.kube/config"
        where = f"not running in a pod, and {shown}"
        names = variable.split(os.pathsep) if variable else ["~/.kube/config"]
    paths = [Path(name).expanduser() for name in names if name]
    if not any(path.is_file() for path in paths):
        return f"{where} {'is not a file' if any(p.exists() for p in paths) else 'does not exist'}"
    if isinstance(error, config.ConfigException):
        return f"{where} cannot be used: {' '.join(str(error).split()).rstrip('.')}"
    return f"{where} is not a kubeconfig file"
