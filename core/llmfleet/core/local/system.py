"""The local system's supervisor: everything `llmfleet up` runs, inside a network namespace of
its own.

`llmfleet up` (control.py) binds the ports the user talks to on the machine's 127.0.0.1
(gateway, Prometheus, the API server), then starts this module under `unshare --net` with those
listening sockets inherited. In the fresh namespace it brings up, in order: the local cluster
(its API server on the same port number), the CRDs, Prometheus, the pod runner, the operator,
the autoscaler and the gateway, then the sample services (or the user's file). A socket
created in one namespace stays in it, so the relays here accept connections from the user's
shell on the inherited sockets and connect to the same port on this namespace's 127.0.0.1:
TCP bytes cross, packets never leave either loopback.

Components run as child processes and are restarted when they exit, as a Deployment would
restart its pod (1 s, 2 s, … 10 s apart). SIGTERM stops everything in reverse order. Progress
goes to stdout as `STEP <message>` lines and `READY` when the system serves; `up` shows them.

What it needs: root, or an unprivileged user namespace (`unshare --user --map-root-user`), for
the namespace and the pods' veth pairs; iproute2 and util-linux.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from llmfleet.core import loopback
from llmfleet.core.cluster import LocalCluster, build, nodes
from llmfleet.core.local import layout, podnet, processes
from llmfleet.core.local.podrunner import http_ok

log = logging.getLogger("llmfleet.system")


def say(kind: str, message: str = "") -> None:
    """One progress line for `llmfleet up` (it reads this process's stdout)."""
    print(f"{kind} {message}".rstrip(), flush=True)


@dataclass
class Child:
    """One supervised component process."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    ready_url: str | None = None
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    next_start: float = 0.0

    def start(self) -> None:
        with self.log_path.open("ab") as out:
            self.process = subprocess.Popen(
                self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT
            )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, grace: float = 15.0) -> None:
        processes.stop(self.process, grace)


class System:
    def __init__(
        self, paths: layout.Paths, ports: layout.Ports, services: Path | None, chart: bool = False
    ) -> None:
        self.paths = paths
        self.ports = ports
        self.services = services
        self.chart = chart
        """Run the components from the Helm chart, as pods, instead of as our own children."""
        self.cluster = LocalCluster(layout.CLUSTER_NAME, state=paths.root)
        self.children: list[Child] = []
        self.stopping = False

    # -- start ---------------------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        python_bin = str(Path(sys.executable).parent)
        return {
            **os.environ,
            "KUBECONFIG": str(self.cluster.kubeconfig),
            loopback.ENV: "true",
            # The pods' IPs live in this namespace, behind veth pairs to each engine's own.
            loopback.NETWORKS_ENV: podnet.POD_NETWORK,
            "PATH": os.pathsep.join([python_bin, os.environ.get("PATH", "")]),
            "PYTHONUNBUFFERED": "1",
        }

    def _child(self, name: str, argv: list[str], env: dict[str, str], ready: str | None) -> Child:
        child = Child(name, argv, env, self.paths.logs / f"{name}.log", ready)
        self.children.append(child)
        child.start()
        return child

    def _wait_ready(self, child: Child, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not child.alive():
                raise RuntimeError(f"{child.name} exited: see {child.log_path}")
            if child.ready_url is None or http_ok(child.ready_url):
                return
            time.sleep(0.2)
        raise RuntimeError(f"{child.name} not ready after {timeout:.0f}s: see {child.log_path}")

    def start(self) -> None:
        self.paths.logs.mkdir(parents=True, exist_ok=True)
        say("STEP", f"starting the local cluster (API server on 127.0.0.1:{self.ports.api})")
        # Engine pods turn Ready when the pod runner's probe of their engine passes, as with a
        # kubelet's readiness probe (cluster/stages.py), never on kwok's say-so.
        self.cluster.up(
            port=self.ports.api,
            runner_owns_engines=True,
            step=lambda message: say("STEP", message),
        )
        if not self.chart:  # the chart brings its own
            say("STEP", "installing the CRDs")
            for manifest in layout.crd_files():
                self.cluster.kubectl("apply", "--server-side", "-f", str(manifest))
            self.cluster.kubectl(
                "wait", "--for=condition=Established", "--timeout=60s",
                "crd/inferenceservices.llmfleet.dev",
            )  # fmt: skip
        env = self._env()

        say("STEP", f"starting Prometheus on 127.0.0.1:{self.ports.prometheus}")
        self.paths.prometheus.mkdir(parents=True, exist_ok=True)
        config = self.paths.prometheus / "prometheus.yml"
        config.write_text(yaml.safe_dump(layout.prometheus_config(self.paths, self.ports)))
        if not self.paths.engine_targets.exists():
            self.paths.engine_targets.write_text("[]")
        prometheus = self._child(
            "prometheus",
            [
                str(build.ensure_binary("prometheus")),
                f"--config.file={config}",
                f"--storage.tsdb.path={self.paths.prometheus / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.ports.prometheus}",
                "--storage.tsdb.retention.time=1d",
                "--log.level=warn",
            ],
            env,
            f"http://127.0.0.1:{self.ports.prometheus}/-/ready",
        )
        self._wait_ready(prometheus)

        say("STEP", "starting the pod runner (one engine simulator per Ready engine pod)")
        runner_argv = [
            sys.executable, "-m", "llmfleet.core.local.podrunner",
            "--binary", str(build.ensure_binary("llm-d-inference-sim")),
            "--logs", str(self.paths.logs / "engines"),
            "--targets", str(self.paths.engine_targets),
        ]  # fmt: skip
        if self.chart:
            runner_argv += ["--components", str(self.paths.logs / "components")]
        self._wait_ready(self._child("podrunner", runner_argv, env, None), timeout=2)
        if self.chart:
            self._install_chart()
        else:
            self._start_components(env)

        services = self.services or layout.SAMPLES
        say("STEP", f"applying {services}")
        self.cluster.kubectl("apply", "-f", str(services))

    def _start_components(self, env: dict[str, str]) -> None:
        """The operator, autoscaler and gateway as children of this supervisor."""
        cli = [sys.executable, "-m", "llmfleet.core.cli"]

        say("STEP", f"starting the operator (metrics on 127.0.0.1:{self.ports.operator})")
        operator_env = env | {
            "LLMFLEET_OPERATOR_METRICS_PORT": str(self.ports.operator),
            "LLMFLEET_OPERATOR_METRICS_HOST": "127.0.0.1",
            "LLMFLEET_OPERATOR_DRAIN_SECONDS": "15",
            "LLMFLEET_OPERATOR_RESYNC_SECONDS": "5",
            "LLMFLEET_OPERATOR_GATEWAY_URL": f"http://127.0.0.1:{self.ports.gateway}",
            # Canary analysis asks the system's Prometheus (the chart's values do the same).
            "LLMFLEET_OPERATOR_PROMETHEUS_URL": f"http://127.0.0.1:{self.ports.prometheus}",
        }
        self._wait_ready(
            self._child(
                "operator",
                [*cli, "operator"],
                operator_env,
                f"http://127.0.0.1:{self.ports.operator}/metrics",
            )
        )

        say("STEP", f"starting the autoscaler (metrics on 127.0.0.1:{self.ports.autoscaler})")
        autoscaler_env = env | {
            "LLMFLEET_AUTOSCALER_METRICS_PORT": str(self.ports.autoscaler),
            "LLMFLEET_AUTOSCALER_METRICS_HOST": "127.0.0.1",
            "LLMFLEET_AUTOSCALER_INTERVAL_SECONDS": "5",
            "LLMFLEET_AUTOSCALER_SCRAPE_INTERVAL": f"{layout.SCRAPE_SECONDS}s",
            "LLMFLEET_AUTOSCALER_STATUS_REFRESH_SECONDS": "15",
        }
        self._wait_ready(
            self._child(
                "autoscaler",
                [
                    *cli,
                    "autoscaler",
                    "--prometheus-url",
                    f"http://127.0.0.1:{self.ports.prometheus}",
                ],
                autoscaler_env,
                f"http://127.0.0.1:{self.ports.autoscaler}/metrics",
            )
        )

        say("STEP", f"starting the gateway on 127.0.0.1:{self.ports.gateway}")
        gateway_env = env | {
            "LLMFLEET_GATEWAY_HOST": "127.0.0.1",
            "LLMFLEET_GATEWAY_PORT": str(self.ports.gateway),
        }
        self._wait_ready(
            self._child(
                "gateway",
                [*cli, "gateway"],
                gateway_env,
                f"http://127.0.0.1:{self.ports.gateway}/readyz",
            )
        )

    def chart_values(self) -> dict[str, object]:
        """Values for the chart on this machine: one replica each, and the gateway and the
        metrics on the system's ports (its component processes share this namespace, see
        components.py); the operator publishes the gateway URL the user reaches."""
        ports = self.ports
        return {
            "loopbackOnly": True,
            "operator": {
                "replicas": 1,
                "metricsPort": ports.operator,
                "gatewayUrl": f"http://127.0.0.1:{ports.gateway}",
                "podDisruptionBudget": {"enabled": False},
                "settings": {"metricsHost": "127.0.0.1", "drainSeconds": 15, "resyncSeconds": 5},
            },
            "autoscaler": {
                # One process (two would share its metrics port here), so no Lease needed.
                "replicas": 1,
                "leaderElection": False,
                "prometheusUrl": f"http://127.0.0.1:{ports.prometheus}",
                "metricsPort": ports.autoscaler,
                "settings": {
                    "metricsHost": "127.0.0.1",
                    "intervalSeconds": 5,
                    "scrapeInterval": f"{layout.SCRAPE_SECONDS}s",
                    "statusRefreshSeconds": 15,
                },
            },
            "gateway": {
                "replicas": 1,
                "port": ports.gateway,
                # A machine of one user: no API keys (the chart requires them unless told so),
                # and /metrics on the gateway's port, where the system's Prometheus scrapes it.
                "auth": "none",
                "podDisruptionBudget": {"enabled": False},
                "settings": {"host": "127.0.0.1", "adminPort": None},
            },
        }

    def _install_chart(self) -> None:
        """`helm install` of charts/llmfleet: the pod runner runs its component pods."""
        say("STEP", "adding a CPU node for llmfleet's own pods")
        self.cluster.kubectl("apply", "-f", "-", stdin=json.dumps(nodes.cpu_node()))
        values = self.paths.root / "chart-values.yaml"
        values.write_text(yaml.safe_dump(self.chart_values()))
        say("STEP", f"helm install {layout.CHART_RELEASE} {layout.CHART}")
        helm = subprocess.run(
            [
                str(build.ensure_binary("helm")), "install", layout.CHART_RELEASE,
                str(layout.CHART), "--namespace", layout.CHART_NAMESPACE, "--create-namespace",
                "--values", str(values), "--kubeconfig", str(self.cluster.kubeconfig),
            ],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        if helm.returncode != 0:
            raise RuntimeError(f"helm install failed: {helm.stderr.strip()[-2000:]}")
        say("STEP", "waiting for the chart's operator, autoscaler and gateway pods")
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if (
                http_ok(f"http://127.0.0.1:{self.ports.gateway}/readyz")
                and self._components_ready()
            ):
                return
            time.sleep(0.5)
        raise RuntimeError(
            "the chart's components are not ready after 180s: see "
            f"{self.paths.logs / 'podrunner.log'} and {self.paths.logs / 'components'}"
        )

    def _components_ready(self) -> bool:
        pods = json.loads(
            self.cluster.kubectl(
                "get",
                "pods",
                "-n",
                layout.CHART_NAMESPACE,
                "-o",
                "json",
                "-l",
                "app.kubernetes.io/component in (operator,autoscaler,gateway)",
            )
        )["items"]
        return len(pods) >= 3 and all(
            any(
                c["type"] == "Ready"
                and c["status"] == "True"
                and c.get("reason") == "ComponentReady"
                for c in pod.get("status", {}).get("conditions", [])
            )
            for pod in pods
        )

    # -- run -----------------------------------------------------------------------------------

    async def supervise(self) -> None:
        """Restart children that exit until SIGTERM."""
        while not self.stopping:
            now = time.monotonic()
            for child in self.children:
                if child.alive() or self.stopping:
                    continue
                if child.process is not None:
                    code = child.process.returncode
                    child.process = None
                    child.restarts += 1
                    backoff = processes.restart_backoff(child.restarts)
                    child.next_start = now + backoff
                    log.warning("%s exited with %s; restarting in %.0fs", child.name, code, backoff)
                if now >= child.next_start:
                    child.start()
                    log.warning("%s restarted (restart %d)", child.name, child.restarts)
            await asyncio.sleep(0.5)

    def stop(self) -> None:
        self.stopping = True
        for child in reversed(self.children):
            child.stop()
        with contextlib.suppress(Exception):
            self.cluster.down()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def relay(listening: socket.socket, port: int) -> asyncio.Server:
    """Accept on `listening` (a socket of the user's namespace) and connect each client to
    127.0.0.1:`port` here."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))

    return await asyncio.start_server(handle, sock=listening)


async def _main(args: argparse.Namespace) -> int:
    paths = layout.Paths(Path(args.state))
    ports = layout.Ports(**json.loads(args.ports))
    services = Path(args.services) if args.services else None
    system = System(paths, ports, services, chart=args.chart)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await asyncio.to_thread(system.start)
    except Exception as error:
        say("FAILED", str(error))
        await asyncio.to_thread(system.stop)
        return 1
    servers = []
    for spec in args.relay:
        fd, port = (int(part) for part in spec.split(":"))
        listening = socket.socket(fileno=fd)
        servers.append(await relay(listening, port))
    say("READY")
    supervisor = asyncio.create_task(system.supervise())
    await stop.wait()
    say("STEP", "stopping")
    for server in servers:
        server.close()
    supervisor.cancel()
    await asyncio.to_thread(system.stop)
    say("STOPPED")
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description="The local system (run by `llmfleet up`).")
    parser.add_argument("--state", required=True)
    parser.add_argument("--ports", required=True, help="JSON of layout.Ports")
    parser.add_argument("--services")
    parser.add_argument("--relay", action="append", default=[], help="FD:PORT")
    parser.add_argument("--chart", action="store_true", help="components from the Helm chart")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    sys.exit(asyncio.run(_main(args)))


if __name__ == "__main__":
    main()
