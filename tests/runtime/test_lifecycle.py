"""The launcher's life cycle against a real engine process on 127.0.0.1 (llm-d-inference-sim):
readiness only after warm-up; SIGTERM drains in-flight streams and refuses new requests."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from llmfleet.runtime.errors import ExitCode
from llmfleet.runtime.metrics import gauge_sum
from tests.runtime.processes import LAUNCHER, free_port, sim_command, status, stop, wait_for

MODEL = "sim-model"


@dataclass
class Launcher:
    process: subprocess.Popen[bytes]
    front: str
    engine: str
    log: Path

    def ready(self) -> int | None:
        return status(f"{self.front}/health/ready")

    def exit_code(self, timeout: float) -> int:
        return self.process.wait(timeout=timeout)

    def last_line(self) -> str:
        lines = [line for line in self.log.read_text().splitlines() if "llmfleet-runtime" in line]
        return lines[-1]


@pytest.fixture
def launch(sim_binary: Path, tmp_path: Path) -> Iterator[Any]:
    started: list[Launcher] = []

    def start(
        sim_flags: list[str],
        served: str = MODEL,
        env: dict[str, str] | None = None,
        **sections: dict[str, Any],
    ) -> Launcher:
        port, engine_port = free_port(), free_port()
        config = {
            "model": {"name": served},
            "warmup": {"requests": 2, "maxTokens": 6, **sections.get("warmup", {})},
            "serving": {"port": port, "enginePort": engine_port, **sections.get("serving", {})},
        }
        path = tmp_path / f"config-{port}.json"
        path.write_text(json.dumps(config))
        engine = " ".join(sim_command(sim_binary, "{port}", MODEL, *sim_flags))
        log = tmp_path / f"launcher-{port}.log"
        with log.open("wb") as sink:
            process = subprocess.Popen(
                [LAUNCHER, "serve", "--config", path, "--engine-command", engine],
                stdout=sink,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
            )
        launcher = Launcher(
            process, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{engine_port}", log
        )
        started.append(launcher)
        return launcher

    yield start
    for launcher in started:
        # SIGTERM first: the launcher stops its engine; SIGKILL only if it does not exit.
        if launcher.process.poll() is None:
            launcher.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                launcher.process.wait(timeout=20)
        stop(launcher.process)


def _completed_requests(engine: str) -> float:
    text = httpx.get(f"{engine}/metrics", timeout=2).text
    return gauge_sum(text, "vllm:request_success_total") or 0.0


SYSTEM_PROMPT = " ".join(["You are a terse assistant for the llmfleet test suite."] * 30)


def test_ready_only_after_warm_up_and_with_the_system_prompt_cached(launch: Any) -> None:
    # Each warm-up request takes ~50 ms + 5 x 60 ms; 3 of them keep the pod warming ~1 s.
    # --enable-kvcache makes the simulator keep a prefix cache (it needs POD_IP to start).
    sim = ["--startup-duration", "1s", "--time-to-first-token", "50ms",
           "--inter-token-latency", "60ms", "--enable-kvcache"]  # fmt: skip
    launcher = launch(sim, warmup={"systemPrompts": [SYSTEM_PROMPT]}, env={"POD_IP": "127.0.0.1"})
    seen_warming = False
    deadline = time.monotonic() + 30
    while launcher.ready() != 200:
        assert time.monotonic() < deadline, "never became ready"
        assert launcher.process.poll() is None, launcher.log.read_text()[-2000:]
        # The engine is healthy, the launcher is up, and still it must not be ready.
        if status(f"{launcher.engine}/health/ready") == 200 and launcher.ready() == 503:
            seen_warming = True
        time.sleep(0.02)
    assert seen_warming, "readiness never lagged the engine's own health"
    # Ready: the system prompt and both warm-up requests had completed on the engine.
    assert _completed_requests(launcher.engine) >= 3
    # The first user request that shares the system prompt finds it in the prefix cache.
    messages = [{"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": "What is a fleet?"}]  # fmt: skip
    response = httpx.post(
        f"{launcher.front}/v1/chat/completions",
        json={"model": MODEL, "messages": messages, "max_tokens": 2},
        timeout=10,
    )
    assert response.status_code == 200
    usage = response.json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] >= 0.8 * usage["prompt_tokens"]


@dataclass
class Stream:
    tokens: int = 0
    done: bool = False
    first: threading.Event = field(default_factory=threading.Event)
    error: str = ""


def _stream(url: str, max_tokens: int, result: Stream) -> None:
    body = {"model": MODEL, "prompt": "tell me", "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True}  # fmt: skip
    try:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
            for line in response.iter_lines():
                if line == "data: [DONE]":
                    result.done = True
                elif line.startswith("data: "):
                    choices = json.loads(line[6:]).get("choices") or [{}]
                    if choices[0].get("text"):
                        result.tokens += 1
                        result.first.set()
    except httpx.HTTPError as error:
        result.error = type(error).__name__
    result.first.set()


def _start_streams(
    front: str, count: int, max_tokens: int
) -> tuple[list[Stream], list[threading.Thread]]:
    streams = [Stream() for _ in range(count)]
    threads = [threading.Thread(target=_stream, args=(front, max_tokens, s)) for s in streams]
    for thread in threads:
        thread.start()
    for s in streams:
        assert s.first.wait(10), "stream never started"
    return streams, threads


@dataclass(frozen=True)
class DrainCase:
    id: str
    grace: float
    max_tokens: int
    """At 100 ms per token: 15 tokens take ~1.5 s, 60 take ~6 s."""
    exit_code: ExitCode
    finished: bool
    """Whether the in-flight streams run to their end ([DONE]) or are cut off."""


DRAIN_CASES = [
    DrainCase("streams-finish-within-grace", 20, 15, ExitCode.OK, finished=True),
    DrainCase("grace-ends-first", 1, 60, ExitCode.DRAIN_TIMEOUT, finished=False),
]


@pytest.mark.parametrize("case", DRAIN_CASES, ids=[case.id for case in DRAIN_CASES])
def test_sigterm_drains(launch: Any, case: DrainCase) -> None:
    grace, max_tokens, exit_code, finished = (
        case.grace, case.max_tokens, case.exit_code, case.finished
    )  # fmt: skip
    launcher = launch(["--time-to-first-token", "20ms", "--inter-token-latency", "100ms"],
                      serving={"drainGraceSeconds": grace}, warmup={"maxTokens": 1})  # fmt: skip
    wait_for(lambda: launcher.ready() == 200 or None, 30, "readiness")
    streams, threads = _start_streams(launcher.front, 3, max_tokens)
    signalled = time.monotonic()
    launcher.process.send_signal(signal.SIGTERM)
    wait_for(lambda: launcher.ready() == 503 or None, 5, "readiness to drop")
    refused = httpx.post(
        f"{launcher.front}/v1/completions",
        json={"model": MODEL, "prompt": "late", "max_tokens": 2},
        timeout=5,
    )
    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "1"
    assert launcher.exit_code(timeout=grace + 20) == exit_code
    elapsed = time.monotonic() - signalled
    for thread in threads:
        thread.join(timeout=10)
    assert all(s.done == finished for s in streams), [(s.tokens, s.done, s.error) for s in streams]
    if finished:
        assert [s.tokens for s in streams] == [max_tokens] * 3
        assert elapsed < grace
    else:
        assert all(s.tokens < max_tokens for s in streams)
        assert elapsed >= grace
    assert f"exit {int(exit_code)} ({exit_code.name})" in launcher.last_line()


@pytest.mark.parametrize(
    ("engine_flags", "served", "exit_code", "words"),
    [
        pytest.param(["--no-such-flag"], MODEL, ExitCode.ENGINE_FAILED,
                     "engine exited with code", id="engine-exits-while-starting"),
        pytest.param([], "another-model", ExitCode.WARMUP_FAILED,
                     "the engine serves ['sim-model'], not 'another-model'", id="wrong-model"),
    ],
)  # fmt: skip
def test_failures_end_with_their_exit_code(
    launch: Any, engine_flags: list[str], served: str, exit_code: ExitCode, words: str
) -> None:
    launcher = launch(engine_flags, served=served)
    assert launcher.exit_code(timeout=30) == exit_code
    log = launcher.log.read_text()
    assert words in log
    assert f"exit {int(exit_code)} ({exit_code.name})" in launcher.last_line()


def test_a_busy_serving_port_fails_before_the_engine_starts(tmp_path: Path) -> None:
    marker = tmp_path / "engine-started"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        config = {"model": {"name": MODEL}, "serving": {"port": port, "host": "127.0.0.1"}}
        path = tmp_path / "config.json"
        path.write_text(json.dumps(config))
        result = subprocess.run(
            [LAUNCHER, "serve", "--config", path, "--engine-command", f"touch {marker}"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
    assert result.returncode == ExitCode.FRONT_FAILED
    assert f"cannot serve on 127.0.0.1:{port}" in result.stderr
    assert not marker.exists()


def test_liveness_follows_a_hung_engine_once_serving(launch: Any) -> None:
    launcher = launch([])
    wait_for(lambda: launcher.ready() == 200 or None, 30, "readiness")
    assert status(f"{launcher.front}/health") == 200
    (engine,) = psutil.Process(launcher.process.pid).children()
    engine.suspend()  # SIGSTOP: the process lives but answers nothing, like a hung GPU
    try:
        # The launcher gives the engine 5 s to answer before it declares it dead.
        assert httpx.get(f"{launcher.front}/health", timeout=15).status_code == 503
    finally:
        engine.resume()
    assert status(f"{launcher.front}/health") == 200


def test_sigterm_before_ready_stops_cleanly(launch: Any) -> None:
    launcher = launch(["--startup-duration", "30s"])
    wait_for(lambda: launcher.ready() == 503 or None, 10, "the front to answer")
    # The front binds before the engine is started: wait for the engine process to exist.
    engine = wait_for(
        lambda: next(iter(psutil.Process(launcher.process.pid).children()), None),
        10, "the engine process",
    )  # fmt: skip
    launcher.process.send_signal(signal.SIGTERM)
    assert launcher.exit_code(timeout=20) == ExitCode.OK
    assert "stopped during starting, before the pod was ready" in launcher.log.read_text()
    assert not engine.is_running()


def test_the_front_passes_engine_answers_through_unchanged(launch: Any) -> None:
    launcher = launch([])
    wait_for(lambda: launcher.ready() == 200 or None, 30, "readiness")
    body = {"model": "no-such-model", "prompt": "hi", "max_tokens": 2}
    direct = httpx.post(f"{launcher.engine}/v1/completions", json=body, timeout=10)
    through = httpx.post(f"{launcher.front}/v1/completions", json=body, timeout=10)
    assert direct.status_code >= 400
    assert (through.status_code, through.json()) == (direct.status_code, direct.json())
    models = httpx.get(f"{launcher.front}/v1/models", params={"x": "1"}, timeout=10)
    assert [m["id"] for m in models.json()["data"]] == [MODEL]


def test_the_engine_dies_with_a_killed_launcher(launch: Any) -> None:
    launcher = launch([])
    wait_for(lambda: launcher.ready() == 200 or None, 30, "readiness")
    (engine,) = psutil.Process(launcher.process.pid).children()
    launcher.process.kill()
    launcher.process.wait(timeout=10)
    wait_for(lambda: (not engine.is_running()) or None, 10, "the orphaned engine to die")
