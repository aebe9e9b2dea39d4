"""The Helm chart on the local system (`llmfleet up --chart`, issue 17): its operator, autoscaler
and gateway pods run — the pod runner starts each pod's `llmfleet` command with the pod's own
environment and a token of the pod's ServiceAccount, so the chart's RBAC is all they get — and
the sample services become Ready and answer through the chart's gateway."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import psutil
import pytest
import yaml

from e2e.conftest import running_system
from e2e.system import LocalSystem, wait_for
from llmfleet.core.local import layout

pytestmark = pytest.mark.e2e

COMPONENTS = ("operator", "autoscaler", "gateway")


@pytest.fixture(scope="module")
def chart_system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSystem]:
    yield from running_system(tmp_path_factory, "chart-state", "--chart")


def component_pods(system: LocalSystem) -> dict[str, dict[str, Any]]:
    listing = system.get("pods", "-n", layout.CHART_NAMESPACE, "-l", "app.kubernetes.io/name")
    return {pod["metadata"]["labels"]["app.kubernetes.io/component"]: pod
            for pod in listing["items"]}  # fmt: skip


def component_process(system: LocalSystem, component: str) -> psutil.Process:
    """The one `llmfleet COMPONENT` process of the system (the supervisor starts none of its own
    with --chart, so this is the one the pod runner started for the chart's pod)."""
    found = []
    for process in system.processes():
        try:
            line = process.cmdline()
        except psutil.Error:
            continue
        if "llmfleet.core.cli" in line and line[-1:] == [component]:
            found.append(process)
    assert len(found) == 1, f"{len(found)} {component} processes"
    return found[0]


def test_the_charts_components_run_as_their_service_accounts(chart_system: LocalSystem) -> None:
    pods = component_pods(chart_system)
    assert sorted(pods) == sorted(COMPONENTS)
    for component, pod in pods.items():
        ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
        assert (ready["status"], ready["reason"]) == ("True", "ComponentReady"), component
        account = pod["spec"]["serviceAccountName"]
        assert account == f"{layout.CHART_RELEASE}-{component}"
        # The process the runner started for the pod: its command, its pod's env, and a
        # kubeconfig whose only credential is a token of the pod's ServiceAccount.
        env = component_process(chart_system, component).environ()
        chart_env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
        assert {name: env.get(name) for name in chart_env} == chart_env
        config = yaml.safe_load(Path(env["KUBECONFIG"]).read_text())
        [user] = config["users"]
        assert user["name"] == f"system:serviceaccount:{layout.CHART_NAMESPACE}:{account}"
        assert set(user["user"]) == {"token"}


def test_services_are_ready_and_answer_through_the_charts_gateway(
    chart_system: LocalSystem,
) -> None:
    def ready() -> list[dict[str, Any]] | None:
        items: list[dict[str, Any]] = chart_system.get("inferenceservices", "-n", "default")[
            "items"
        ]
        return items if all(
            any(c["type"] == "Ready" and c["status"] == "True"
                for c in item.get("status", {}).get("conditions", []))
            for item in items
        ) and items else None  # fmt: skip

    services = wait_for(ready, 120, "the sample services Ready")
    for service in services:
        status = service["status"]
        assert status["endpoint"] == chart_system.gateway  # the operator's gatewayUrl value
    wait_for(
        lambda: all(s.get("status", {}).get("autoscaling") for s in
                    chart_system.get("inferenceservices", "-n", "default")["items"]
                    if s["spec"].get("autoscaling", {}).get("enabled")) or None,
        90, "the chart's autoscaler writing status.autoscaling",
    )  # fmt: skip
    api = openai.OpenAI(base_url=chart_system.base_url, api_key="none", timeout=30, max_retries=0)
    with api:
        for model in ("qwen-7b", "llama-8b-pd"):
            chat = api.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "Hello"}], max_tokens=8
            )
            assert chat.choices[0].message.content, model
    # The chart's RBAC was enough: no component was refused anything on the way.
    for log_file in chart_system.paths.logs.glob("components/*.log"):
        refused = [line for line in log_file.read_text(errors="replace").splitlines()
                   if re.search(r"\b403\b|Forbidden|forbidden", line)]  # fmt: skip
        assert not refused, f"{log_file.name}: {refused[:3]}"
    # The only gateway there is answered: the process of the chart's gateway pod.
    account = component_pods(chart_system)["gateway"]["spec"]["serviceAccountName"]
    config = component_process(chart_system, "gateway").environ()["KUBECONFIG"]
    assert account in Path(config).read_text()
