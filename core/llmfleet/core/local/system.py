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
from llmfleet.core.local import chart, layout, podnet, processes, vllm_engine
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
        self,
        paths: layout.Paths,
        ports: layout.Ports,
        services: Path | None,
        images: dict[str, tuple[str, Path]] | None = None,
        vllm_cpu: Path | None = None,
    ) -> None:
        self.paths = paths
        self.ports = ports
        self.services = services
        self.images = images
        """With a real node: image name -> (reference, OCI archive) of `control-plane` and
        `engine-local`; the chart then runs on the real node from them (chart.py)."""
        self.vllm_cpu = vllm_cpu
        """A build of `llmfleet images vllm-cpu`: its sample is served by real vLLM on the real
        node (vllm_engine.py)."""
        self.real_node = False
        """Whether the cluster came up with its real node (else the pod runner runs it all)."""
        self.gateway_upstream: tuple[str, int] | None = None
        """Where the gateway relay connects when the gateway is a pod on the real node."""
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
        spec = self.cluster.up(
            port=self.ports.api,
            runner_owns_engines=True,
            real_node=self.images is not None,
            real_node_images=[archive for _, archive in (self.images or {}).values()],
            real_node_gpus=nodes.NodePool("H100", 1, layout.REAL_NODE_GPUS),
            step=lambda message: say("STEP", message),
        )
        self.real_node = spec.real_node
        if self.images is not None and not self.real_node:
            say("STEP", "going on without a real node: the components as processes, the pod "
                        "runner's engines")  # fmt: skip
        if not self.real_node:  # the chart brings its own
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
        config.write_text(
            yaml.safe_dump(layout.prometheus_config(self.paths, self.ports, self.real_node))
        )
        for targets in (self.paths.engine_targets, self.paths.component_targets):
            if not targets.exists():
                targets.write_text("[]")
        prometheus = self._child(
            "prometheus",
            [
                str(build.ensure_binary("prometheus")),
                f"--config.file={config}",
                f"--storage.tsdb.path={self.paths.prometheus / 'data'}",
                # With a real node its pods (the autoscaler) reach it on the node's address;
                # either way only inside this namespace.
                f"--web.listen-address={self._prometheus_host()}:{self.ports.prometheus}",
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
        if self.real_node:
            runner_argv += ["--component-targets", str(self.paths.component_targets)]
        self._wait_ready(self._child("podrunner", runner_argv, env, None), timeout=2)
        if self.real_node:
            self._install_chart_on_real_node()
        else:
            self._start_components(env)

        services = self.services or layout.SAMPLES
        say("STEP", f"applying {services}")
        self.cluster.kubectl("apply", "-f", str(services))
        if self.vllm_cpu is not None and self.real_node:
            say("STEP", f"applying {vllm_engine.SAMPLE} (real vLLM, its CPU build from "
                        f"{self.vllm_cpu}, on the real node)")  # fmt: skip
            vllm_engine.install(self.cluster.kubectl, self.vllm_cpu)
        elif self.vllm_cpu is not None:
            say("STEP", "no real node: the vllm-cpu sample is not applied (its engine runs "
                        "only in a container)")  # fmt: skip

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
        # Fast passes every second on gauges scraped every SCRAPE_SECONDS: a warm spare serves
        # within about 3 s of the first queued request (`autoscaler/promote.py`). The caller's
        # environment may set another (0: none, as before issue 30; the e2e's baseline).
        fast = {"LLMFLEET_AUTOSCALER_FAST_INTERVAL_SECONDS": "1"}
        autoscaler_env = (
            fast
            | env
            | {
                "LLMFLEET_AUTOSCALER_METRICS_PORT": str(self.ports.autoscaler),
                "LLMFLEET_AUTOSCALER_METRICS_HOST": "127.0.0.1",
                "LLMFLEET_AUTOSCALER_INTERVAL_SECONDS": "5",
                "LLMFLEET_AUTOSCALER_SCRAPE_INTERVAL": f"{layout.SCRAPE_SECONDS}s",
                "LLMFLEET_AUTOSCALER_STATUS_REFRESH_SECONDS": "15",
            }
        )
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

    def _prometheus_host(self) -> str:
        return "0.0.0.0" if self.real_node else "127.0.0.1"

    def _install_chart_on_real_node(self) -> None:
        """`helm install` of charts/llmfleet from the built images: its pods run on the real
        node; the user's gateway port then leads to the gateway Service."""
        assert self.images is not None
        references = {name: reference for name, (reference, _) in self.images.items()}
        say("STEP", f"helm install {layout.CHART_RELEASE} {layout.CHART} "
                    f"(image {references['control-plane']}, on the real node)")  # fmt: skip
        values = chart.real_node_values(self.ports, references)
        # Both namespaces enforce Pod Security `restricted`: the chart's pods and the engine
        # pods of the samples (in `default`) must pass it, as on a locked-down cluster.
        for namespace in chart.RESTRICTED_NAMESPACES:
            self.cluster.kubectl("apply", "-f", "-", stdin=json.dumps(chart.namespace(namespace)))
        chart.install(self.cluster, values, self.paths.root / "chart-values.yaml")
        say("STEP", "waiting for the operator, autoscaler and gateway pods to be Ready")
        chart.wait(
            lambda: chart.components_ready(self.cluster),
            180,
            "the chart's pods are not Ready: `kubectl get pods -n "
            f"{layout.CHART_NAMESPACE}` and their logs say why",
        )
        self.gateway_upstream = chart.gateway_address(self.cluster)
        host, port = self.gateway_upstream
        chart.wait(
            lambda: http_ok(f"http://{host}:{port}/v1/models"),
            60,
            f"the gateway Service ({host}:{port}) does not answer",
        )

    def upstream(self, port: int) -> tuple[str, int]:
        """Where the relay of the user's `port` connects inside this namespace."""
        if self.gateway_upstream is not None and port == self.ports.gateway:
            return self.gateway_upstream
        return "127.0.0.1", port

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


async def relay(listening: socket.socket, upstream: tuple[str, int]) -> asyncio.Server:
    """Accept on `listening` (a socket of the user's namespace) and connect each client to
    `upstream` (host, port) here."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*upstream)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))

    return await asyncio.start_server(handle, sock=listening)


async def _main(args: argparse.Namespace) -> int:
    paths = layout.Paths(Path(args.state))
    ports = layout.Ports(**json.loads(args.ports))
    services = Path(args.services) if args.services else None
    images = (
        {name: (reference, Path(archive)) for name, (reference, archive) in
         json.loads(args.images).items()}
        if args.images else None
    )  # fmt: skip
    vllm_cpu = Path(args.vllm_cpu) if args.vllm_cpu else None
    system = System(paths, ports, services, images=images, vllm_cpu=vllm_cpu)
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
        servers.append(await relay(listening, system.upstream(port)))
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
    parser.add_argument(
        "--images", help="JSON: name -> [reference, archive]; the chart then runs on a real node"
    )
    parser.add_argument(
        "--vllm-cpu", help="a build of `llmfleet images vllm-cpu`: its sample on the real node"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    sys.exit(asyncio.run(_main(args)))


if __name__ == "__main__":
    main()
