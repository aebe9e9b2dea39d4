"""The running local system as the e2e tests see it: its ports, its cluster, its processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psutil

from llmfleet.core.cluster import LocalCluster, build
from llmfleet.core.cluster.toolchain import TOOLS_BY_NAME
from llmfleet.core.local import layout
from tests.net import wait_for as _wait_for

T = TypeVar("T")


def wait_for(check: Callable[[], T | None], timeout: float, what: str, every: float = 0.2) -> T:
    """The tests' `wait_for`, polling every 0.2 s: each check here runs kubectl or an HTTP call."""
    return _wait_for(check, timeout, what, every)


class LocalSystem:
    def __init__(self, state: Path, env: dict[str, str], gateway: int, prometheus: int) -> None:
        self.state = state
        self.env = env
        self.paths = layout.Paths(state / "system")
        self.gateway = f"http://127.0.0.1:{gateway}"
        self.base_url = f"{self.gateway}/v1"
        self.prometheus = f"http://127.0.0.1:{prometheus}"
        self.http = httpx.Client(timeout=30, trust_env=False)
        self.up_output = ""
        """What `llmfleet up` printed on stdout (the endpoints and the first commands)."""
        self.node = LocalCluster(layout.CLUSTER_NAME, state=self.paths.root).real_node()
        """The system's real node; `on_real_node` says whether it runs one."""

    @property
    def on_real_node(self) -> bool:
        """Whether the system runs a real node (`llmfleet up --real-node`), so that the chart's
        components and the engine pods that landed there are containers, not supervised
        processes."""
        return self.node.paths.dir.is_dir()

    # -- the user's commands ---------------------------------------------------------------------

    def llmfleet(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "llmfleet.core.cli", *args],
            env=self.env, capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        kubectl = build.binary(TOOLS_BY_NAME["kubernetes"], "kubectl")
        done = subprocess.run(
            [str(kubectl), "--kubeconfig", str(self.paths.kubeconfig), *args],
            input=stdin, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def down(self) -> None:
        self.llmfleet("down", timeout=180)
        self.http.close()

    # -- what the system is doing ----------------------------------------------------------------

    def record(self) -> layout.Record:
        record = layout.Record.read(self.paths.record)
        assert record is not None, f"no {self.paths.record}"
        return record

    def processes(self) -> list[psutil.Process]:
        """Every process of the system: its supervisor's session and, on a real node, every
        process of the node's containers (in the node's cgroups: a container is not in the
        session, nor in the system's network namespace)."""
        record = layout.Record.read(self.paths.record)
        if record is None:
            return []
        containers = self.node.container_pids() if self.on_real_node else set()
        found = []
        for process in psutil.process_iter():
            try:
                if process.pid in containers or os.getsid(process.pid) == record.pid:
                    found.append(process)
            except (ProcessLookupError, PermissionError):
                continue
        return found

    def component(self, name: str) -> psutil.Process:
        """The process of one component (`gateway`, `operator`, `podrunner`, …): supervised, or
        on a real node the main process of the chart's container (`llmfleet <name>`; with two
        replicas, either one)."""

        def match() -> psutil.Process | None:
            for process in self.processes():
                try:
                    line = process.cmdline()
                except psutil.Error:
                    continue
                if name == "prometheus" and line and line[0].endswith("/prometheus"):
                    return process
                if name == "podrunner" and "llmfleet.core.local.podrunner" in line:
                    return process
                if "llmfleet.core.cli" in line and name in line[line.index("llmfleet.core.cli") :]:
                    return process
                if len(line) >= 2 and line[-2].endswith("llmfleet") and line[-1] == name:
                    return process  # the chart's `command: [llmfleet, <name>]`
            return None

        return wait_for(match, 30, f"the {name} process")

    def logs(self, name: str) -> str:
        """What component `name` (`operator`, `autoscaler`, `gateway`) logged: its supervised
        process's log file, or on a real node its pods' logs, those of a container the kubelet
        restarted included."""
        if not self.on_real_node:
            return (self.paths.logs / f"{name}.log").read_text(errors="replace")
        selector = f"app.kubernetes.io/component={name}"
        pods = self.get("pods", "-n", layout.CHART_NAMESPACE, "-l", selector)["items"]
        found = []
        for pod in pods:
            args = ("logs", "-n", layout.CHART_NAMESPACE, pod["metadata"]["name"])
            if any(c.get("restartCount") for c in pod["status"].get("containerStatuses", [])):
                found.append(self.kubectl(*args, "--previous"))
            found.append(self.kubectl(*args))
        return "\n".join(found)

    def kill(self, name: str, signum: int = signal.SIGKILL) -> int:
        process = self.component(name)
        process.send_signal(signum)
        return process.pid

    def engines(self) -> list[psutil.Process]:
        found = []
        for process in self.processes():
            try:
                if process.name().startswith("llm-d-inference"):
                    found.append(process)
            except psutil.Error:
                continue
        return found

    def engine_of(self, pod: str) -> psutil.Process:
        """The engine process the pod runner started for `pod` (its POD_IP is the pod's IP)."""
        ip = self.get("pod", pod, "-n", "default")["status"]["podIP"]
        for engine in self.engines():
            try:
                if engine.environ().get("POD_IP") == ip:
                    return engine
            except psutil.Error:
                continue
        raise AssertionError(f"no engine runs for pod {pod} ({ip})")

    def models(self) -> list[str]:
        try:
            answer = self.http.get(f"{self.base_url}/models")
        except httpx.HTTPError:
            return []
        return [model["id"] for model in answer.json()["data"]] if answer.status_code == 200 else []

    def wait_models(self, names: list[str], timeout: float = 120) -> None:
        def serving() -> bool | None:
            if not set(names) <= set(self.models()):
                return None
            for name in names:
                body = {"model": name, "prompt": "warm up", "max_tokens": 2}
                try:
                    if self.http.post(f"{self.base_url}/completions", json=body).status_code != 200:
                        return None
                except httpx.HTTPError:
                    return None
            return True

        wait_for(serving, timeout, f"{names} to answer through the gateway", every=0.5)

    def diagnose(self, log_lines: int = 60) -> str:
        """What the system looked like, for a failed test's report: the engine pods (serving
        label, Ready and its reason), the pool EndpointSlices, the services' status, and the last
        lines of each component's log (they say when a pod was promoted, turned unready or a pool
        lost its endpoints). Never raises: a broken system is what it is there to describe."""
        parts = []
        commands = {
            "pods": ("get", "pods", "-A", "-o", "wide", "--show-labels"),
            "ready conditions": ("get", "pods", "-A", "-o", "custom-columns=POD:.metadata.name,"
                                 "READY:.status.conditions[?(@.type=='Ready')].reason,"
                                 "SINCE:.status.conditions[?(@.type=='Ready')].lastTransitionTime"),
            # Why a container restarted (OOMKilled, Error with its exit code, a failed probe
            # shows as Error 137 after the kubelet's kill).
            "restarts": ("get", "pods", "-A", "-o", "custom-columns=POD:.metadata.name,"
                         "RESTARTS:.status.containerStatuses[*].restartCount,"
                         "LAST:.status.containerStatuses[*].lastState.terminated.reason,"
                         "EXIT:.status.containerStatuses[*].lastState.terminated.exitCode,"
                         "AT:.status.containerStatuses[*].lastState.terminated.finishedAt"),
            "endpointslices": ("get", "endpointslices", "-A", "-o", "wide"),
            "services": ("get", "inferenceservices", "-A", "-o", "wide"),
        }  # fmt: skip
        for title, args in commands.items():
            try:
                parts.append(f"--- kubectl {' '.join(args[:2])} ({title})\n{self.kubectl(*args)}")
            except Exception as error:  # the report says what could not be read
                parts.append(f"--- {title}: {error}")
        if self.on_real_node:
            for component in ("operator", "autoscaler", "gateway"):
                args = ("logs", "-n", layout.CHART_NAMESPACE, f"deployment/llmfleet-{component}",
                        "--all-containers", f"--tail={log_lines}")  # fmt: skip
                try:
                    parts.append(f"--- kubectl logs ({component} pod)\n{self.kubectl(*args)}")
                except Exception as error:
                    parts.append(f"--- {component} pod logs: {error}")
        if self.on_real_node:  # an engine container that restarted: how its last run ended
            parts.extend(self._restarted_engine_logs(log_lines))
        logs = [*self.paths.logs.glob("*.log"), *self.paths.logs.glob("components/*.log")]
        for log_file in sorted(logs):
            try:
                lines = log_file.read_text(errors="replace").splitlines()[-log_lines:]
            except OSError as error:
                lines = [str(error)]
            parts.append(f"--- {log_file.name} (last {log_lines} lines)\n" + "\n".join(lines))
        return "\n".join(parts)

    def _restarted_engine_logs(self, log_lines: int) -> list[str]:
        parts = []
        try:
            pods = self.get("pods", "-n", "default")["items"]
        except Exception as error:
            return [f"--- engine pods: {error}"]
        for pod in pods:
            statuses = pod.get("status", {}).get("containerStatuses", [])
            if not any(status.get("restartCount") for status in statuses):
                continue
            name = pod["metadata"]["name"]
            args = ("logs", "-n", "default", name, "--previous", f"--tail={log_lines}")
            try:
                parts.append(f"--- kubectl logs --previous {name}\n{self.kubectl(*args)}")
            except Exception as error:
                parts.append(f"--- {name} previous logs: {error}")
        return parts

    def query(self, promql: str) -> list[dict[str, Any]]:
        answer = self.http.get(f"{self.prometheus}/api/v1/query", params={"query": promql})
        answer.raise_for_status()
        result: list[dict[str, Any]] = answer.json()["data"]["result"]
        return result

    def pods(self, service: str, pool: str | None = None) -> list[dict[str, Any]]:
        selector = f"llmfleet.dev/service={service}"
        if pool:
            selector += f",llmfleet.dev/pool={pool}"
        items: list[dict[str, Any]] = self.get("pods", "-n", "default", "-l", selector)["items"]
        return items

    def serving(self, service: str, pool: str) -> list[str]:
        """Names of the pool's pods that are serving and Ready because their engine is: on the
        real node the kubelet's probe says so; on a kwok node, the pod runner's reason
        `EngineReady` (kwok marks a new pod Ready before its engine started, and the runner takes
        that back within a second)."""
        names = []
        for pod in self.pods(service, pool):
            labels = pod["metadata"].get("labels", {})
            conditions = pod.get("status", {}).get("conditions", [])
            # On the real node the kubelet's readiness probe says Ready (no reason given).
            real = pod.get("spec", {}).get("nodeName") == self.node.name
            ready = any(
                c["type"] == "Ready"
                and c["status"] == "True"
                and (real or c.get("reason") == "EngineReady")
                for c in conditions
            )
            if ready and labels.get("llmfleet.dev/serving") == "true":
                names.append(pod["metadata"]["name"])
        return sorted(names)
