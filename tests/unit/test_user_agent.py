"""Each llmfleet component names itself in its requests' User-Agent, so the API server's audit
log tells them apart (the Kubernetes client's default is the same for all of them)."""

from __future__ import annotations

import asyncio
from importlib.metadata import version
from pathlib import Path

import kopf
import pytest
import yaml

from llmfleet.core.kube import api_client, user_agent
from llmfleet.operator.login import identified


def _kubeconfig(tmp_path: Path) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
            }
        )
    )
    return str(path)


@pytest.mark.parametrize("component", ["operator", "gateway", "autoscaler"])
def test_a_components_client_says_which_component_and_version(
    component: str, tmp_path: Path
) -> None:
    agent = api_client(_kubeconfig(tmp_path), component=component).user_agent
    assert agent == user_agent(component) == f"llmfleet-{component}/{version('llmfleet')}"


def test_a_client_for_no_component_keeps_the_clients_default(tmp_path: Path) -> None:
    assert api_client(_kubeconfig(tmp_path)).user_agent.startswith("OpenAPI-Generator/")


def test_kopfs_session_names_the_operator_and_keeps_the_credentials() -> None:
    info = kopf.ConnectionInfo(
        server="https://127.0.0.1:6443", token="t", insecure=True, default_namespace="ns"
    )

    async def session_of() -> tuple[kopf.AiohttpSession, dict[str, str]]:
        context = identified(info, "llmfleet-operator/1")
        headers = dict(context.aiohttp_session.headers)
        await context.aiohttp_session.close()
        return context, headers

    context, headers = asyncio.run(session_of())
    assert headers == {"User-Agent": "llmfleet-operator/1", "Authorization": "Bearer t"}
    assert (context.server, context.default_namespace) == ("https://127.0.0.1:6443", "ns")
