"""The launcher's life cycle against a real engine process on 127.0.0.1 (llm-d-inference-sim,
or the stand-in that records when it answered): readiness on the side port only after warm-up;
the drain, begun by the preStop hook or SIGTERM, takes the pod out of readiness and lets every
request in the engine finish, also one sent after the drain began."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from llmfleet.runtime.errors import ExitCode
from llmfleet.runtime.metrics import gauge_sum
from tests.net import free_port, status, wait_for
from tests.runtime.processes import LAUNCHER, Launcher, Launchers, sim_command, standin_command

MODEL = "sim-model"
# The engine gets 0.5 s after SIGTERM, then SIGKILL: llm-d-inference-sim would otherwise drain
# by itself and hide a launcher that stopped it too early.
QUICK_STOP = {"engineStopSeconds": 0.5, "drainSettleSeconds": 0.5}


def _sim(
    launchers: Launchers,
    sim_binary: Path,
    sim_flags: list[str],
    served: str = MODEL,
    env: dict[str, str] | None = None,
    **sections: dict[str, Any],
) -> Launcher:
    config = {
        "model": {"name": served},
        "warmup": {"requests": 2, "maxTokens": 6, **sections.get("warmup", {})},
        "serving": sections.get("serving", {}),
    }
    return launchers.start(sim_command(sim_binary, "{port}", MODEL, *sim_flags), config, env)


def _completed_requests(engine: str) -> float:
    text = httpx.get(f"{engine}/metrics", timeout=2).text
    return gauge_sum(text, "vllm:request_success_total") or 0.0


SYSTEM_PROMPT = " ".join(["You are a terse assistant for the llmfleet test suite."] * 30)


def test_ready_only_after_warm_up_and_with_the_system_prompt_cached(
    launchers: Launchers, sim_binary: Path
) -> None:
    # Each warm-up request takes ~50 ms + 5 x 60 ms; 3 of them keep the pod warming ~1 s.
    # --enable-kvcache makes the simulator keep a prefix cache (it needs POD_IP to start).
    sim = ["--startup-duration", "1s", "--time-to-first-token", "50ms",
           "--inter-token-latency", "60ms", "--enable-kvcache"]  # fmt: skip
    launcher = _sim(launchers, sim_binary, sim, warmup={"systemPrompts": [SYSTEM_PROMPT]},
                    env={"POD_IP": "127.0.0.1"})  # fmt: skip
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
        f"{launcher.engine}/v1/chat/completions",
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


def _stream(url: str, max_tokens: int, result: Stream, path: str = "/v1/completions") -> None:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": max_tokens, "stream": True,
                            "ignore_eos": True}  # fmt: skip
    if path == "/v1/completions":
        body["prompt"] = "tell me"
    else:
        body["messages"] = [{"role": "user", "content": "tell me"}]
    try:
        with httpx.stream("POST", f"{url}{path}", json=body, timeout=60) as response:
            for line in response.iter_lines():
                if line == "data: [DONE]":
                    result.done = True
                elif line.startswith("data: "):
                    choice = (json.loads(line[6:]).get("choices") or [{}])[0]
                    if choice.get("text") or (choice.get("delta") or {}).get("content"):
                        result.tokens += 1
                        result.first.set()
    except httpx.HTTPError as error:
        result.error = type(error).__name__
    result.first.set()


def _start_streams(
    engine: str, count: int, max_tokens: int, path: str = "/v1/completions"
) -> tuple[list[Stream], list[threading.Thread]]:
    """`count` streams straight to the engine, each under way (its first token read)."""
    streams = [Stream() for _ in range(count)]
    threads = [
        threading.Thread(target=_stream, args=(engine, max_tokens, s, path)) for s in streams
    ]
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
def test_sigterm_drains(launchers: Launchers, sim_binary: Path, case: DrainCase) -> None:
    """SIGTERM without a preStop hook (a plain `kill`, or a kubelet that ran none) drains too."""
    grace, max_tokens, exit_code, finished = (
        case.grace, case.max_tokens, case.exit_code, case.finished
    )  # fmt: skip
    launcher = _sim(launchers, sim_binary, ["--time-to-first-token", "20ms",
                    "--inter-token-latency", "100ms"],
                    serving={"drainGraceSeconds": grace, **QUICK_STOP},
                    warmup={"maxTokens": 1})  # fmt: skip
    launcher.wait_ready()
    streams, threads = _start_streams(launcher.engine, 3, max_tokens)
    signalled = time.monotonic()
    launcher.process.send_signal(signal.SIGTERM)
    wait_for(lambda: launcher.ready() == 503 or None, 30, "readiness to drop")
    # A request sent after readiness dropped (the gateway had not heard yet) is served by the
    # engine, which still runs; the drain waits for it as for the others.
    late, late_thread = _start_streams(launcher.engine, 1, max_tokens)
    assert launcher.exit_code(timeout=grace + 20) == exit_code
    elapsed = time.monotonic() - signalled
    for thread in threads + late_thread:
        thread.join(timeout=10)
    streams += late
    assert all(s.done == finished for s in streams), [(s.tokens, s.done, s.error) for s in streams]
    if finished:
        assert [s.tokens for s in streams] == [max_tokens] * 4
        assert elapsed < grace
    else:
        assert all(s.tokens < max_tokens for s in streams)
        assert elapsed >= grace
    assert f"exit {int(exit_code)} ({exit_code.name})" in launcher.last_line()


@dataclass(frozen=True)
class PreStopCase:
    id: str
    grace: float
    max_tokens: int
    """At 50 ms per token (the stand-in's pace): 20 tokens take ~1 s, 400 take ~20 s."""
    hook_status: int
    exit_code: ExitCode


PRE_STOP_CASES = [
    PreStopCase("answers-once-the-engine-is-idle", 20, 20, 200, ExitCode.OK),
    PreStopCase("answers-when-the-grace-ends", 1, 400, 503, ExitCode.DRAIN_TIMEOUT),
]


@pytest.mark.parametrize("case", PRE_STOP_CASES, ids=[case.id for case in PRE_STOP_CASES])
def test_the_pre_stop_hook_drains_then_sigterm_stops(
    launchers: Launchers, case: PreStopCase
) -> None:
    config = {"model": {"name": MODEL}, "warmup": {"requests": 1, "maxTokens": 1},
              "serving": {"drainGraceSeconds": case.grace, **QUICK_STOP}}  # fmt: skip
    launcher = launchers.start(standin_command("unified"), config)
    launcher.wait_ready()
    streams, threads = _start_streams(launcher.engine, 3, case.max_tokens, "/v1/chat/completions")
    hook: list[httpx.Response] = []
    hooked = threading.Thread(target=lambda: hook.append(launcher.pre_stop()))
    hooked.start()
    wait_for(lambda: launcher.ready() == 503 or None, 30, "readiness to drop")
    hooked.join(timeout=case.grace + 10)
    answered = time.monotonic()
    [response] = hook
    assert (response.status_code, response.json()["phase"]) == (case.hook_status, "draining")
    seen = httpx.get(f"{launcher.engine}/seen").json()
    # The warm-up came from the launcher, the streams straight from this process.
    assert [r["peer_pid"] for r in seen] == [launcher.process.pid] + [os.getpid()] * 3
    finished = [r["finished_at"] for r in seen[1:]]
    if case.hook_status == 200:
        # The hook answered only after the engine had sent every stream's last byte.
        assert response.json()["inFlight"] == 0
        assert None not in finished
        assert max(finished) <= answered, (finished, answered)
    else:
        assert response.json()["inFlight"] == 3
        assert finished == [None] * 3
    # Between the hook and SIGTERM the engine runs on, out of traffic; SIGTERM stops it.
    assert status(f"{launcher.engine}/health") == 200
    launcher.process.send_signal(signal.SIGTERM)
    assert launcher.exit_code(timeout=20) == case.exit_code
    for thread in threads:
        thread.join(timeout=10)
    finished_streams = case.hook_status == 200
    assert all(s.done == finished_streams for s in streams), [(s.tokens, s.done) for s in streams]


def test_a_pre_stop_before_ready_keeps_the_pod_out_of_traffic(
    launchers: Launchers, sim_binary: Path
) -> None:
    launcher = _sim(launchers, sim_binary, ["--startup-duration", "2s"])
    wait_for(lambda: launcher.ready() == 503 or None, 10, "the side port to answer")
    response = launcher.pre_stop(timeout=10)  # nothing can be in flight: at once
    assert (response.status_code, response.json()["inFlight"]) == (200, 0)
    wait_for(lambda: "warmed up, but the drain has begun" in launcher.log.read_text() or None,
             30, "the warm-up to end")  # fmt: skip
    assert launcher.ready() == 503
    launcher.process.send_signal(signal.SIGTERM)
    assert launcher.exit_code(timeout=20) == ExitCode.OK


@dataclass(frozen=True)
class Failure:
    id: str
    engine_flags: list[str]
    served: str
    exit_code: ExitCode
    words: str


FAILURES = [
    Failure("engine-exits-while-starting", ["--no-such-flag"], MODEL, ExitCode.ENGINE_FAILED,
            "engine exited with code"),
    Failure("wrong-model", [], "another-model", ExitCode.WARMUP_FAILED,
            "the engine serves ['sim-model'], not 'another-model'"),
]  # fmt: skip


@pytest.mark.parametrize("case", FAILURES, ids=[case.id for case in FAILURES])
def test_failures_end_with_their_exit_code(
    launchers: Launchers, sim_binary: Path, case: Failure
) -> None:
    launcher = _sim(launchers, sim_binary, case.engine_flags, served=case.served)
    assert launcher.exit_code(timeout=30) == case.exit_code
    assert case.words in launcher.log.read_text()
    assert f"exit {int(case.exit_code)} ({case.exit_code.name})" in launcher.last_line()


def test_a_busy_side_port_fails_before_the_engine_starts(tmp_path: Path) -> None:
    marker = tmp_path / "engine-started"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        serving = {"port": free_port(), "launcherPort": port, "host": "127.0.0.1"}
        path = tmp_path / "config.json"
        path.write_text(json.dumps({"model": {"name": MODEL}, "serving": serving}))
        result = subprocess.run(
            [LAUNCHER, "serve", "--config", path, "--engine-command", f"touch {marker}"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
    assert result.returncode == ExitCode.SIDE_PORT_FAILED
    assert f"cannot serve the side port on 127.0.0.1:{port}" in result.stderr
    assert not marker.exists()


def test_sigterm_before_ready_stops_cleanly(launchers: Launchers, sim_binary: Path) -> None:
    launcher = _sim(launchers, sim_binary, ["--startup-duration", "30s"])
    wait_for(lambda: launcher.ready() == 503 or None, 10, "the side port to answer")
    # The side port binds before the engine is started: wait for the engine process to exist.
    engine = wait_for(
        lambda: next(iter(psutil.Process(launcher.process.pid).children()), None),
        10, "the engine process",
    )  # fmt: skip
    launcher.process.send_signal(signal.SIGTERM)
    assert launcher.exit_code(timeout=20) == ExitCode.OK
    assert "stopped during starting, before the pod was ready" in launcher.log.read_text()
    assert not engine.is_running()


def test_the_engine_dies_with_a_killed_launcher(launchers: Launchers, sim_binary: Path) -> None:
    launcher = _sim(launchers, sim_binary, [])
    launcher.wait_ready()
    (engine,) = psutil.Process(launcher.process.pid).children()
    launcher.process.kill()
    launcher.process.wait(timeout=10)
    wait_for(lambda: (not engine.is_running()) or None, 10, "the orphaned engine to die")
