"""Client -> gateway pod -> an engine pod the operator created, its container run by the real
node's kubelet (the session's system, as `make up` starts it), with the official `openai` client,
and the system under faults.

Each fault test counts what the clients saw: answered, failed with an error the client saw, and
lost (a client that hung or a stream that ended with neither a finish reason nor an error). Lost
must be 0. The counts are printed (`pytest -s` shows them) for the issue's fault table.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import openai
import psutil
import pytest

from e2e.system import LocalSystem, wait_for
from llmfleet.core.local import layout

pytestmark = pytest.mark.e2e

MODELS = ("qwen-7b", "llama-8b-pd")
"""The sample services' models: unified `chat` (autoscaled, a warm spare) and disaggregated `pd`."""
LONG = {"ignore_eos": True}
"""vLLM's sampling option (the simulator honours it): generate exactly `max_tokens`."""


def client(system: LocalSystem, timeout: float = 30) -> openai.OpenAI:
    return openai.OpenAI(base_url=system.base_url, api_key="none", timeout=timeout, max_retries=0)


# -- every sample through the gateway -----------------------------------------------------------


@pytest.mark.parametrize("model", MODELS)
def test_sync_chat_and_completion(system: LocalSystem, model: str) -> None:
    with client(system) as api:
        _chat_and_completion(api, model)


def _chat_and_completion(api: openai.OpenAI, model: str) -> None:
    chat = api.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hello"}], max_tokens=8
    )
    assert chat.model == model
    assert chat.choices[0].message.content
    assert chat.usage is not None
    assert chat.usage.completion_tokens > 0
    completion = api.completions.create(
        model=model, prompt="Once upon a time", max_tokens=5, extra_body=LONG
    )
    assert completion.choices[0].text
    assert completion.choices[0].finish_reason == "length"


@pytest.mark.parametrize("model", MODELS)
def test_streaming(system: LocalSystem, model: str) -> None:
    with client(system) as api:
        stream = api.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Tell me a story"}],
            max_tokens=16,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=LONG,
        )
        chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert text
    assert finish == ["length"]
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 16


def test_async_concurrent(system: LocalSystem) -> None:
    async def main() -> list[str]:
        api = openai.AsyncOpenAI(base_url=system.base_url, api_key="none", max_retries=0)
        try:
            answers = await asyncio.gather(
                *(
                    api.completions.create(model=model, prompt=f"request {i}", max_tokens=4)
                    for i in range(10)
                    for model in MODELS
                )
            )
        finally:
            await api.close()
        return [answer.model for answer in answers]

    assert Counter(asyncio.run(main())) == {model: 10 for model in MODELS}


def test_models_come_from_discovery(system: LocalSystem) -> None:
    """The gateway lists what the cluster runs: an unknown model is a 404 in OpenAI's shape."""
    assert set(MODELS) <= set(system.models())
    with client(system) as api, pytest.raises(openai.NotFoundError) as raised:
        api.completions.create(model="no-such-model", prompt="x", max_tokens=1)
    assert raised.value.status_code == 404


def _counter_by_pod(system: LocalSystem, metric: str, service: str) -> dict[str, float]:
    rows = system.query(
        f'sum by (pod, llmfleet_dev_pool) ({metric}{{llmfleet_dev_service="{service}"}})'
    )
    return {
        f"{r['metric']['llmfleet_dev_pool']}/{r['metric']['pod']}": float(r["value"][1])
        for r in rows
    }


def test_disaggregated_prefill_and_decode_on_different_engines(system: LocalSystem) -> None:
    """Each request's prefill runs on a prefill pod's engine and its decode on a decode pod's:
    both pools' engines count the requests, as Prometheus scraped them from the pod IPs."""
    before = _counter_by_pod(system, "vllm:request_success_total", "pd")
    with client(system) as api:
        for i in range(6):
            api.completions.create(
                model="llama-8b-pd", prompt=f"prefill me {i} " * 20, max_tokens=4
            )

    def counted() -> dict[str, float] | None:
        after = _counter_by_pod(system, "vllm:request_success_total", "pd")
        grew = {pod: after[pod] - before.get(pod, 0) for pod in after}
        pools = {pod.split("/")[0] for pod, delta in grew.items() if delta >= 6}
        return grew if pools == {"prefill", "decode"} else None

    grew = wait_for(counted, 30, "both pools' engines to count the 6 requests")
    prefill_pods = {pod for pod in grew if pod.startswith("prefill/")}
    decode_pods = {pod for pod in grew if pod.startswith("decode/")}
    assert prefill_pods.isdisjoint(decode_pods)


# -- faults ---------------------------------------------------------------------------------------


@dataclass
class Tally:
    """What the clients of one fault test saw."""

    sent: int = 0
    answered: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    lost: int = 0
    failed_at: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, outcome: str) -> None:
        with self.lock:
            self.sent += 1
            if outcome == "ok":
                self.answered += 1
            elif outcome == "lost":
                self.lost += 1
            else:
                self.failed[outcome] += 1
                self.failed_at.append(time.monotonic())

    def row(self, fault: str) -> str:
        failed = sum(self.failed.values())
        kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(self.failed.items())) or "-"
        window = max(self.failed_at) - min(self.failed_at) if self.failed_at else 0.0
        return (
            f"FAULT {fault}: sent {self.sent}, answered {self.answered}, "
            f"failed {failed} ({kinds}; within {window:.1f}s), lost {self.lost}"
        )


def stream_once(api: openai.OpenAI, model: str, max_tokens: int) -> str:
    """One streaming request: `ok`, the kind of error the client saw, or `lost`."""
    try:
        stream = api.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Write at length"}],
            max_tokens=max_tokens,
            stream=True,
            extra_body=LONG,
        )
        finish = None
        for chunk in stream:
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
    except openai.APITimeoutError:
        return "lost"  # the client hung until its timeout
    except openai.APIStatusError as error:
        return f"http {error.status_code}"
    except openai.APIError as error:
        return type(error).__name__
    return "ok" if finish else "lost"


def traffic(
    system: LocalSystem,
    tally: Tally,
    *,
    stop: threading.Event,
    model: str,
    max_tokens: int,
    workers: int,
) -> list[threading.Thread]:
    """`workers` clients sending streaming requests back to back until `stop`."""

    def work() -> None:
        with client(system, timeout=60) as api:
            while not stop.is_set():
                outcome = stream_once(api, model, max_tokens)
                tally.add(outcome)
                if outcome != "ok":
                    time.sleep(0.25)  # a client backing off, not a tight loop of errors

    threads = [threading.Thread(target=work, daemon=True) for _ in range(workers)]
    for thread in threads:
        thread.start()
    return threads


def under_traffic(
    system: LocalSystem, fault: Callable[[], object], model: str = "qwen-7b", *,
    max_tokens: int = 64, workers: int = 4, before: float = 2, after: float = 6,
) -> Tally:  # fmt: skip
    tally, stop = Tally(), threading.Event()
    threads = traffic(system, tally, stop=stop, model=model, max_tokens=max_tokens, workers=workers)
    time.sleep(before)
    fault()
    time.sleep(after)
    stop.set()
    for thread in threads:
        thread.join(90)
        assert not thread.is_alive(), "a client hung"
    return tally


def test_engine_killed_mid_stream(system: LocalSystem) -> None:
    """SIGKILL the engine of `chat`'s serving pod while streams run on it: the streams it carried
    end with an error event the client sees; the pod is not Ready until its engine answers again
    (the launcher exits with its engine and the kubelet restarts the container), and requests
    meanwhile fail fast rather than hang."""
    killed: list[str] = []

    def kill_engine() -> None:
        engine = system.engine_of(system.serving("chat", "unified")[0])
        killed.append(" ".join(engine.cmdline()))
        engine.kill()

    tally = under_traffic(system, kill_engine, max_tokens=200, workers=6)
    print(tally.row("engine killed mid-stream"))
    assert killed
    assert tally.lost == 0
    assert tally.answered > 0
    system.wait_models(["qwen-7b"])


def test_gateway_restarted_under_load(system: LocalSystem) -> None:
    """SIGKILL the gateway pod's process under load: the kubelet restarts its container; clients
    see connection errors meanwhile, none hangs, and requests succeed afterwards."""
    old = system.component("gateway").pid
    tally = under_traffic(system, lambda: system.kill("gateway"), max_tokens=32, after=8)
    print(tally.row("gateway restarted under load"))
    assert tally.lost == 0
    assert not any(kind == "http 404" for kind in tally.failed), "a starting gateway said 404"
    assert system.component("gateway").pid != old
    system.wait_models(list(MODELS))


def _scale(system: LocalSystem, pool: str, replicas: int) -> None:
    patch = f'{{"spec": {{"topology": {{"{pool}": {{"replicas": {replicas}}}}}}}}}'
    system.kubectl("patch", "inferenceservice", "pd", "-n", "default", "--type=merge", "-p", patch)


def test_operator_killed_during_scale_up(system: LocalSystem) -> None:
    """Scale `pd`'s prefill pool 1 -> 2 and SIGKILL the operator at once: once it is back it
    finishes the scale-up with exactly two serving pods, and traffic meanwhile is unharmed."""
    assert len(system.serving("pd", "prefill")) == 1

    def fault() -> None:
        _scale(system, "prefill", 2)
        system.kill("operator")

    tally = under_traffic(system, fault, model="llama-8b-pd", max_tokens=16, after=4)
    serving = wait_for(
        lambda: names if len(names := system.serving("pd", "prefill")) == 2 else None,
        90, "two serving prefill pods",
    )  # fmt: skip
    time.sleep(5)  # nothing more appears later: no duplicate pods
    assert sorted(pod["metadata"]["name"] for pod in system.pods("pd", "prefill")) == serving
    print(tally.row("operator killed during a scale-up"))
    assert tally.lost == 0
    assert sum(tally.failed.values()) == 0


def test_scale_down_drains(system: LocalSystem) -> None:
    """Scale `pd`'s prefill pool back to 1 under traffic: the demoted pod drains before it goes,
    so no client request fails."""
    if len(system.serving("pd", "prefill")) < 2:
        _scale(system, "prefill", 2)
        wait_for(lambda: len(system.serving("pd", "prefill")) == 2 or None, 90, "two prefill pods")
    stop_after = 25.0  # past the local drain (15 s) and the pod's deletion
    tally = under_traffic(
        system, lambda: _scale(system, "prefill", 1), model="llama-8b-pd",
        max_tokens=16, after=stop_after,
    )  # fmt: skip
    wait_for(lambda: len(system.pods("pd", "prefill")) == 1 or None, 60, "one prefill pod")
    print(tally.row("scale-down drains"))
    assert tally.lost == 0
    assert sum(tally.failed.values()) == 0
    assert tally.answered > 0


def _chat_sizing(system: LocalSystem) -> str:
    status = system.get("inferenceservice", "chat", "-n", "default").get("status", {})
    return str(status.get("autoscaling", {}).get("pools", {}).get("unified", {}).get("reason", ""))


def test_prometheus_stopped_for_a_minute(system: LocalSystem) -> None:
    """SIGSTOP Prometheus for 60 s: the autoscaler holds every pool where it is and says why in
    `status.autoscaling`; traffic through the gateway does not depend on it; after SIGCONT the
    autoscaler sizes from metrics again."""
    prometheus = system.component("prometheus")
    before = system.serving("chat", "unified")
    outage = 60.0

    def stop_prometheus() -> None:
        prometheus.send_signal(signal.SIGSTOP)

    try:
        tally = under_traffic(
            system, stop_prometheus, max_tokens=16, workers=2, before=1, after=outage
        )
        held = _chat_sizing(system)
    finally:
        prometheus.send_signal(signal.SIGCONT)
    print(tally.row("Prometheus stopped for a minute"))
    print(f"PROMETHEUS STOPPED: chat/unified said {held!r}")
    assert held.startswith("holding"), held
    assert "metrics" in held
    assert system.serving("chat", "unified") == before
    assert tally.lost == 0
    assert sum(tally.failed.values()) == 0
    wait_for(
        lambda: True if not _chat_sizing(system).startswith("holding") else None,
        60, "the autoscaler to size from metrics again",
    )  # fmt: skip


@pytest.mark.last
def test_down_leaves_nothing(system: LocalSystem) -> None:
    """`llmfleet down`: no process of the system (its session, its network namespace or the real
    node's containers) and no listening port is left; `status` then says it is not running."""
    ports = [int(url.rsplit(":", 1)[1]) for url in (system.gateway, system.prometheus)]
    record = system.record()
    assert system.processes(), "the system should be running before down"
    containers = system.node.container_pids() if system.on_real_node else set()
    assert containers or not system.on_real_node, "the real node should run containers"
    done = system.llmfleet("down", timeout=180)
    assert done.returncode == 0, done.stderr
    left = []
    for process in psutil.process_iter():
        try:
            if (
                process.pid in containers
                or os.getsid(process.pid) == record.pid
                or layout.netns_of(process.pid) == record.netns
            ):
                left.append(" ".join(process.cmdline())[:100])
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    assert left == []
    assert system.node.container_pids() == set(), "the real node's cgroups still hold processes"
    for port in [*ports, record.ports.api]:
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", port)) != 0, f"127.0.0.1:{port} still listens"
    again = system.llmfleet("status")
    assert again.returncode == 1
    assert "not running" in again.stderr
