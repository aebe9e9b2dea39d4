"""Where the local system keeps its state, which ports it uses, and Prometheus's configuration.

State lives in `<state>/system/` (`$LLMFLEET_STATE_DIR`, else `~/.local/state/llmfleet`):
`system.json` (the supervisor's pid, its network namespace and the ports), `logs/` (one file per
component, `engines/` one per pod), `prometheus/` and the cluster's own folder.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from llmfleet.core.cluster.local import state_root

CLUSTER_NAME = "llmfleet"
SAMPLES = Path(__file__).resolve().parent / "samples" / "services.yaml"
CHART = Path(__file__).resolve().parents[4] / "charts" / "llmfleet"
"""The Helm chart `llmfleet up --real-node` installs (from the checkout)."""
CHART_RELEASE = "llmfleet"
CHART_NAMESPACE = "llmfleet"
REAL_NODE_GPUS = 16
"""Fake H100s the real node advertises: room for the samples at their largest (5 + 3 pods) and
as many pods again of the user's (the e2e suite's load step runs two services beside them);
each engine pod there asks for 100m CPU and 384Mi, so 16 fit this machine's 2 cores."""
SCRAPE_SECONDS = 2
"""Prometheus's scrape interval in the local system."""


def crd_files() -> list[Path]:
    """The CRD manifests (the InferenceService, its admission policy of the rollout
    annotations, and kopf's peering), from the checkout."""
    from llmfleet.crds.render import MANIFESTS_DIR  # noqa: PLC0415 - pydantic models: only here

    return sorted(MANIFESTS_DIR.glob("*.yaml"))


@dataclass(frozen=True)
class Ports:
    """127.0.0.1 ports: the first three are relayed to the user's shell, the last two are only
    inside the system's namespace."""

    gateway: int = 8080
    prometheus: int = 9090
    api: int = 6443
    operator: int = 8081
    autoscaler: int = 8082

    def relayed(self) -> dict[str, int]:
        return {"gateway": self.gateway, "prometheus": self.prometheus, "api": self.api}


@dataclass(frozen=True)
class Paths:
    root: Path

    @classmethod
    def default(cls) -> Paths:
        return cls(state_root() / "system")

    @property
    def record(self) -> Path:
        return self.root / "system.json"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def prometheus(self) -> Path:
        return self.root / "prometheus"

    @property
    def component_targets(self) -> Path:
        """The chart's component pods on the real node, for Prometheus (kubelet_targets.py)."""
        return self.root / "prometheus" / "components.json"

    @property
    def engine_targets(self) -> Path:
        return self.prometheus / "engines.json"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "clusters" / CLUSTER_NAME / "kubeconfig"


@dataclass(frozen=True)
class Record:
    """What `up` writes once the supervisor runs, for `status` and `down`."""

    pid: int
    netns: str
    """The supervisor's network namespace (`net:[inode]`)."""
    ports: Ports
    started: float

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)) + "\n")

    @classmethod
    def read(cls, path: Path) -> Record | None:
        try:
            data = json.loads(path.read_text())
            return cls(
                pid=int(data["pid"]),
                netns=str(data["netns"]),
                ports=Ports(**data["ports"]),
                started=float(data["started"]),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None


def netns_of(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def prometheus_config(paths: Paths, ports: Ports, real_node: bool = False) -> dict[str, Any]:
    """Engines from the pod runner's file (labelled like the ServiceMonitor's targets), and the
    gateway, operator and autoscaler: on the system's ports, or, with a real node, the chart's
    pods from the pod runner's second file (kubelet_targets.py)."""
    interval = f"{SCRAPE_SECONDS}s"
    components = [
        {"targets": [f"127.0.0.1:{port}"], "labels": {"component": name}}
        for name, port in (
            ("gateway", ports.gateway),
            ("operator", ports.operator),
            ("autoscaler", ports.autoscaler),
        )
    ]
    return {
        "global": {
            "scrape_interval": interval,
            "scrape_timeout": interval,
            "evaluation_interval": interval,
        },
        # The chart's recording rules and alerts (the same files its PrometheusRules carry), so
        # the local Prometheus has the dashboards' series and shows the alerts (its /alerts).
        "rule_files": [str(path) for path in sorted((CHART / "files" / "rules").glob("*.yaml"))],
        "scrape_configs": [
            {
                "job_name": "engines",
                "file_sd_configs": [
                    {"files": [str(paths.engine_targets)], "refresh_interval": "1s"}
                ],
            },
            {"job_name": "llmfleet", "static_configs": components}
            if not real_node
            else {
                "job_name": "llmfleet",
                "file_sd_configs": [
                    {"files": [str(paths.component_targets)], "refresh_interval": "1s"}
                ],
            },
        ],
    }
