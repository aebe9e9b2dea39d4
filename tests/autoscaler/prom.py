"""A real Prometheus scraping simulator engines on 127.0.0.1, and closed-loop load on them, for
tests of the signals layer and of the autoscaler reading it.

    with Prometheus(prometheus_binary, tmp_path) as prom, engines(...) as started:
        prom.set_targets(started)
        prom.wait_scraped(started)
        with Load(started).running():
            PrometheusSignals(prom.url, rate_window="5s").read_all()

Prometheus scrapes every second (`scrape_interval`) the targets listed in file-based service
discovery files: `engines.json` (job `engines`, the target's labels added to its series, as the
ServiceMonitor's podTargetLabels do) and `exporters.json` (job `exporters`, `honor_labels`, for
stand-ins of exporters such as DCGM's that label series with the pod they describe). It
evaluates the rule files it is given (`rule_files`) every second unless a group says otherwise.

`UriLimit` stands in front of it as the proxies of production do, refusing long URLs.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import yaml

from tests.net import free_port, status, wait_for
from tests.runtime.processes import sim_command, stop


@dataclass(frozen=True)
class Target:
    """Something Prometheus scrapes: `host:port` and the labels its series get."""

    address: str
    labels: dict[str, str] = field(default_factory=dict)


class Engine:
    """One llm-d-inference-sim process on a free port, labelled as a pod of one pool."""

    def __init__(
        self,
        binary: Path,
        *,
        namespace: str,
        service: str,
        pool: str,
        pod: str | None = None,
        model: str = "m",
        flags: Sequence[str] = (),
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.model = model
        self.pod = pod or f"{service}-{pool}-{self.port}"
        self.target = Target(
            f"127.0.0.1:{self.port}",
            {
                "namespace": namespace,
                "llmfleet_dev_service": service,
                "llmfleet_dev_pool": pool,
                "pod": self.pod,
            },
        )
        # POD_IP: the simulator's KV-cache events need it when --enable-kvcache is given.
        self.process = subprocess.Popen(
            sim_command(binary, self.port, model, *flags),
            env={**os.environ, "POD_IP": "127.0.0.1"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_for(lambda: status(f"{self.url}/health/ready") == 200 or None, 20, "the engine")
        except AssertionError:
            self.stop()
            raise

    def stop(self) -> None:
        stop(self.process)


@dataclass(frozen=True)
class EngineSpec:
    namespace: str
    service: str
    pool: str
    flags: tuple[str, ...] = ()


@contextlib.contextmanager
def engines(binary: Path, *specs: EngineSpec) -> Iterator[list[Engine]]:
    """One Engine per spec, all stopped when the block ends."""
    started: list[Engine] = []
    try:
        for spec in specs:
            started.append(
                Engine(
                    binary,
                    namespace=spec.namespace,
                    service=spec.service,
                    pool=spec.pool,
                    flags=spec.flags,
                )
            )
        yield started
    finally:
        for engine in started:
            engine.stop()


class Prometheus:
    """Prometheus on 127.0.0.1:<free port> with its storage in `directory`; a context manager
    that stops it (and checks its port is free again) on exit."""

    def __init__(
        self,
        binary: Path,
        directory: Path,
        *,
        scrape_interval: str = "1s",
        lifecycle: bool = False,
        rule_files: Sequence[Path] = (),
    ) -> None:
        self.binary = binary
        self.rule_files = list(rule_files)
        self.directory = directory
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.scrape_interval = scrape_interval
        self.lifecycle = lifecycle
        self.process: subprocess.Popen[bytes] | None = None

    def _config(self) -> dict[str, object]:
        def job(name: str, honor_labels: bool) -> dict[str, object]:
            return {
                "job_name": name,
                "honor_labels": honor_labels,
                "file_sd_configs": [
                    {"files": [str(self.directory / f"{name}.json")], "refresh_interval": "1s"}
                ],
            }

        return {
            "global": {
                "scrape_interval": self.scrape_interval,
                "scrape_timeout": self.scrape_interval,
                "evaluation_interval": self.scrape_interval,
            },
            "scrape_configs": [job("engines", False), job("exporters", True)],
            "rule_files": [str(path) for path in self.rule_files],
        }

    def start(self) -> Prometheus:
        self.directory.mkdir(parents=True, exist_ok=True)
        for name in ("engines", "exporters"):
            self._write_targets(name, [])
        config = self.directory / "prometheus.yml"
        config.write_text(yaml.safe_dump(self._config()))
        argv = [
            str(self.binary),
            f"--config.file={config}",
            f"--storage.tsdb.path={self.directory / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]
        if self.lifecycle:
            argv.append("--web.enable-lifecycle")
        log = (self.directory / "prometheus.log").open("wb")
        self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        try:
            wait_for(lambda: self._ready() or None, 30, "Prometheus to be ready")
        except AssertionError:
            self.stop()
            raise AssertionError(self.log_tail()) from None
        return self

    def _ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"Prometheus exited: {self.log_tail()}")
        return status(f"{self.url}/-/ready") == 200

    def log_tail(self) -> str:
        path = self.directory / "prometheus.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def _write_targets(self, name: str, targets: Sequence[Target]) -> None:
        groups = [{"targets": [target.address], "labels": target.labels} for target in targets]
        path = self.directory / f"{name}.json"
        partial = path.with_suffix(".json.tmp")
        partial.write_text(json.dumps(groups))
        partial.replace(path)  # atomic: Prometheus never reads half a file

    def set_targets(
        self, engines: Sequence[Engine | Target], exporters: Sequence[Target] = ()
    ) -> None:
        """Replace what Prometheus scrapes (picked up within about a second): engines, or
        targets of the job `engines` (one engine may be scraped as several pods, each with its
        own labels)."""
        self._write_targets("engines", [e.target if isinstance(e, Engine) else e for e in engines])
        self._write_targets("exporters", exporters)

    def wait_scraped(self, engines: Sequence[Engine], timeout: float = 30) -> None:
        """Until every engine's target is up and its gauge is queryable."""
        wanted = {engine.target.address for engine in engines}

        def check() -> bool | None:
            response = httpx.get(f"{self.url}/api/v1/query", params={"query": "up == 1"})
            up = {sample["metric"]["instance"] for sample in response.json()["data"]["result"]}
            return True if wanted <= up else None

        wait_for(check, timeout, f"Prometheus to scrape {sorted(wanted)}")

    def stop(self) -> None:
        """SIGTERM (Prometheus flushes and exits), SIGKILL after 10 s; then the port is free."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                stop(self.process)
        self.process = None
        wait_for(lambda: status(f"{self.url}/-/ready") is None or None, 5, "the port to close")

    def __enter__(self) -> Prometheus:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


class UriLimit:
    """A reverse proxy on 127.0.0.1 in front of `upstream` that answers 414 URI Too Long to a
    request line over `limit` bytes, as nginx does past its default
    `large_client_header_buffers` (8 KB), and forwards every other request (method, path, body
    and its Content-Type); a context manager. `refused` holds the start of each refused
    request line."""

    def __init__(self, upstream: str, limit: int = 8192) -> None:
        self.upstream = upstream
        self.limit = limit
        self.refused: list[str] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def parse_request(self) -> bool:
                if not super().parse_request():
                    return False
                if len(self.requestline) > proxy.limit:
                    proxy.refused.append(self.requestline[:60])
                    self.send_error(HTTPStatus.REQUEST_URI_TOO_LONG)
                    return False
                return True

            def forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                kind = self.headers.get("Content-Type")
                answer = httpx.request(
                    self.command,
                    f"{proxy.upstream}{self.path}",
                    content=body,
                    headers={"Content-Type": kind} if kind else {},
                    timeout=30,
                )
                self.send_response(answer.status_code)
                self.send_header("Content-Type", answer.headers.get("Content-Type", "text/plain"))
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            do_GET = do_POST = forward

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> UriLimit:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


PROMPT = "the quick brown fox jumps over the lazy dog " * 8


@dataclass
class Load:
    """Closed-loop chat completions from `workers` threads, round-robin over the engines."""

    engines: list[Engine]
    workers: int = 6
    done: list[tuple[float, int, int]] = field(default_factory=list)
    """(finished at, prompt tokens, completion tokens) per request."""
    stop: threading.Event = field(default_factory=threading.Event)
    read_at: float = 0.0
    """When the test read the signals (monotonic), for the window it compares with."""

    def _work(self, index: int) -> None:
        with httpx.Client(timeout=30) as client:
            sent = index
            while not self.stop.is_set():
                engine = self.engines[sent % len(self.engines)]
                sent += 1
                body = {
                    "model": engine.model,
                    "messages": [{"role": "user", "content": PROMPT}],
                    "max_tokens": 6,
                    # Exactly 6 tokens: the simulator otherwise picks a random length up to
                    # max_tokens, and the tests compare windowed figures (mean output tokens,
                    # token gaps per request) with the mean over every request sent.
                    "ignore_eos": True,
                }
                response = client.post(f"{engine.url}/v1/chat/completions", json=body)
                response.raise_for_status()
                usage = response.json()["usage"]
                self.done.append(
                    (time.monotonic(), usage["prompt_tokens"], usage["completion_tokens"])
                )

    @contextlib.contextmanager
    def running(self) -> Iterator[Load]:
        threads = [threading.Thread(target=self._work, args=(i,)) for i in range(self.workers)]
        for thread in threads:
            thread.start()
        try:
            yield self
        finally:
            self.stop.set()
            for thread in threads:
                thread.join(timeout=30)

    def rate(self, since: float, until: float) -> float:
        return sum(1 for at, _, _ in self.done if since <= at < until) / (until - since)
