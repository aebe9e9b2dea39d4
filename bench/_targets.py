"""What bench/gateway_overhead.py measures: the fake engines, the way to each target, and the
processes whose CPU time counts.

A target is a base URL plus the headers its requests need. `direct` is the first fake engine;
every proxy (llmfleet, a `--baseline` revision, vllm-router, LiteLLM's proxy) stands in front
of all engines and runs pinned to the gateway core. Peers come from `make bench-peers`
(bench/peers.sh): a peer that is not installed, or does not start, becomes an `Absent` with the
reason, and its column prints "n/a: reason".
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from _support import free_port, pinned, wait_ready

from llmfleet.core.cluster.build import cache_root

BENCH = Path(__file__).resolve().parent
CACHE = cache_root()  # $LLMFLEET_CACHE_DIR, as for every other build
PEERS = CACHE / "bench-peers"
OHA = CACHE / "bin" / "oha"
PY_SPY = PEERS / "py-spy" / "bin" / "py-spy"
MODEL = "bench-model"
LITELLM_KEY = "sk-bench-" + "0123456789abcdef" * 2
"""LiteLLM's proxy refuses to start without a master key; this one is sent as a bearer token."""


@dataclass
class Target:
    name: str
    url: str
    pid: int | None = None
    """The process (and its children) whose CPU time counts; None for `direct`."""
    headers: dict[str, str] = field(default_factory=dict)
    gc_file: Path | None = None
    """llmfleet gateways: where bench/gc_probe.py writes every collection at exit."""
    version: str = ""


@dataclass
class Absent:
    name: str
    reason: str


@dataclass
class Pinning:
    """Which CPU runs what (None: no pinning, fewer than two CPUs)."""

    gateway: int | None
    engines: int | None
    client: int | None

    @classmethod
    def for_this_machine(cls) -> Pinning:
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            return cls(None, None, None)
        return cls(cpus[0], cpus[1], cpus[2] if len(cpus) > 2 else cpus[1])

    def prefix(self, cpu: int | None) -> list[str]:
        return pinned(cpu, []) if cpu is not None else []

    def describe(self) -> str:
        if self.gateway is None:
            return "no pinning (fewer than 2 CPUs)"
        return (
            f"gateway on CPU {self.gateway}, fake engines on CPU {self.engines}, "
            f"load generators (this process, oha) on CPU {self.client}"
        )


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of `pid` and every descendant alive now (all threads)."""
    children: dict[int, list[int]] = {}
    times: dict[int, float] = {}
    ticks = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        child = int(entry)
        children.setdefault(int(fields[1]), []).append(child)
        times[child] = (int(fields[11]) + int(fields[12])) / ticks
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        total += times.get(current, 0.0)
        todo += children.get(current, [])
    return total


def core_busy_seconds(cpu: int) -> float:
    """Time CPU `cpu` has spent running processes (user, system) or taken by the hypervisor
    (steal) since boot (/proc/stat). Interrupt and softirq time is left out: loopback traffic
    is processed there, on behalf of whichever process sent it."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith(f"cpu{cpu} "):
            user, nice, system, _idle, _iowait, _irq, _softirq, steal = map(int, line.split()[1:9])
            return (user + nice + system + steal) / os.sysconf("SC_CLK_TCK")
    raise ValueError(f"no cpu{cpu} in /proc/stat")


def settle(pid: int, busy: float = 0.1, timeout: float = 60) -> None:
    """Wait until `pid` uses less than `busy` of a core over half a second (an overloaded peer
    works off its backlog after its clients have gone), so it does not slow the next target
    on the shared gateway core; gives up after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = process_cpu_seconds(pid)
        time.sleep(0.5)
        if process_cpu_seconds(pid) - before < busy * 0.5:
            return


def _distribution_version(venv: Path, distribution: str) -> str:
    code = f"import importlib.metadata as m; print(m.version({distribution!r}))"
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=False
    )
    return done.stdout.strip()


class Fleet:
    """Starts processes, waits for them, and stops them all when the `with` block ends."""

    def __init__(self, pinning: Pinning, workdir: Path) -> None:
        self.pinning = pinning
        self.workdir = workdir
        self.stack = ExitStack()

    def __enter__(self) -> Fleet:
        self.stack.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stack.__exit__(None, None, None)

    def start(self, name: str, command: list[str], cpu: int | None, **env: str) -> int:
        log = (self.workdir / f"{name}.log").open("wb")
        process = subprocess.Popen(
            self.pinning.prefix(cpu) + command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
        )
        self.stack.callback(log.close)
        self.stack.callback(_stop, process)
        return process.pid

    def log_tail(self, name: str) -> str:
        lines = (self.workdir / f"{name}.log").read_text(errors="replace").strip().splitlines()
        return lines[-1][:200] if lines else "no output"

    def engines(self, count: int, chunks: int, interval_ms: float) -> list[str]:
        ports = [free_port() for _ in range(count)]
        command = [sys.executable, str(BENCH / "fake_engine.py"), "--ports"]
        command += [",".join(map(str, ports)), "--stream-chunks", str(chunks)]
        command += ["--chunk-interval-ms", str(interval_ms)]
        self.start("engines", command, self.pinning.engines)
        urls = [f"http://127.0.0.1:{port}" for port in ports]
        for url in urls:
            wait_ready(url + "/health")
        return urls

    def llmfleet(
        self, name: str, engines: list[str], routing: str, source: Path | None = None
    ) -> Target | Absent:
        """`llmfleet gateway` of this checkout, or of the checkout at `source` (its package
        roots ahead of the editable install), under bench/gc_probe.py."""
        port = free_port()
        config = self.workdir / "fleet.yaml"
        config.write_text(f"models:\n  {MODEL}:\n    unified: [{', '.join(engines)}]\n")
        gc_file = self.workdir / f"{name}-gc.json"
        command = [sys.executable, str(BENCH / "gc_probe.py"), "--out", str(gc_file)]
        if source is not None:
            for part in ("core", "crds", "gateway"):
                command += ["--path", str(source / part)]
        command += ["--", "gateway", "--static-config", str(config), "--host", "127.0.0.1"]
        command += ["--port", str(port), "--profile", routing]
        pid = self.start(name, command, self.pinning.gateway)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(url + "/readyz", timeout=60)
        except SystemExit:
            return Absent(name, f"did not start: {self.log_tail(name)}")
        return Target(name, url, pid, gc_file=gc_file, version=_git_describe(source))

    def vllm_router(self, engines: list[str], policy: str) -> Target | Absent:
        venv = PEERS / "vllm-router"
        if not (venv / "bin" / "vllm-router").exists():
            return Absent("vllm-router", "not installed (make bench-peers)")
        port = free_port()
        command = [str(venv / "bin" / "vllm-router"), "--host", "127.0.0.1", "--port", str(port)]
        command += ["--worker-urls", *engines, "--policy", policy]
        command += ["--prometheus-port", str(free_port())]
        pid = self.start("vllm-router", command, self.pinning.gateway)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(url + "/health", timeout=60)
        except SystemExit:
            return Absent("vllm-router", f"did not start: {self.log_tail('vllm-router')}")
        version = _distribution_version(venv, "vllm-router")
        return Target("vllm-router", url, pid, version=f"{version}, policy {policy}")

    def litellm(self, engines: list[str]) -> Target | Absent:
        venv = PEERS / "litellm"
        if not (venv / "bin" / "litellm").exists():
            return Absent("LiteLLM", "not installed (make bench-peers)")
        config = self.workdir / "litellm.yaml"
        deployments = "".join(
            f"  - model_name: {MODEL}\n    litellm_params:\n      model: openai/{MODEL}\n"
            f"      api_base: {engine}/v1\n      api_key: fake\n"
            for engine in engines
        )
        config.write_text("model_list:\n" + deployments)
        port = free_port()
        command = [str(venv / "bin" / "litellm"), "--config", str(config)]
        command += ["--host", "127.0.0.1", "--port", str(port)]
        # The local cost map: no download at start-up (there is no network here anyway).
        env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False"}
        pid = self.start(
            "litellm", command, self.pinning.gateway, LITELLM_MASTER_KEY=LITELLM_KEY, **env
        )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(url + "/health/liveliness", timeout=180)
        except SystemExit:
            return Absent("LiteLLM", f"did not start: {self.log_tail('litellm')}")
        version = _distribution_version(venv, "litellm")
        headers = {"authorization": f"Bearer {LITELLM_KEY}"}
        return Target("LiteLLM", url, pid, headers=headers, version=f"{version}, 1 worker")


def collections(target: Target, timeout: float = 10) -> list[tuple[float, int, float]]:
    """Every collection bench/gc_probe.py has timed in `target` so far ([start, generation,
    seconds]); empty when it did not answer SIGUSR1 within `timeout`."""
    if target.gc_file is None or target.pid is None:
        return []
    target.gc_file.unlink(missing_ok=True)
    os.kill(target.pid, signal.SIGUSR1)
    deadline = time.monotonic() + timeout
    while not target.gc_file.exists():
        if time.monotonic() > deadline:
            return []
        time.sleep(0.05)
    return [
        (at, generation, seconds)
        for at, generation, seconds in json.loads(target.gc_file.read_text())
    ]


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _git_describe(source: Path | None) -> str:
    where = source or BENCH.parent
    done = subprocess.run(
        ["git", "-C", str(where), "log", "-1", "--format=%h"],
        capture_output=True,
        text=True,
        check=False,
    )
    dirty = subprocess.run(
        ["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() + (" + uncommitted changes" if dirty.stdout.strip() else "")


def installed_version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


@contextmanager
def worktree(revision: str, path: Path) -> Iterator[Path]:
    """A detached git worktree of this repository at `revision`, removed afterwards."""
    subprocess.run(
        ["git", "worktree", "add", "--detach", "--quiet", str(path), revision],
        check=True,
        cwd=BENCH.parent,
    )
    try:
        yield path
    finally:
        subprocess.run(
            ["git", "worktree", "remove", "--force", str(path)],
            check=False,
            capture_output=True,
            cwd=BENCH.parent,
        )
