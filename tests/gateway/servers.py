"""Real servers on 127.0.0.1 for the gateway tests: simulator engines, stand-ins, the gateway."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import uvicorn
from starlette.types import ASGIApp

from llmfleet.gateway.app import create_app
from llmfleet.gateway.discovery import Discovery
from llmfleet.gateway.settings import GatewaySettings
from tests.net import free_port, status, wait_for


class Sim:
    """One llm-d-inference-sim process (killable by the test)."""

    def __init__(self, binary: Path, model: str, *flags: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # --force-dummy-tokenizer: never look the model up on a hub.
        command = [str(binary), "--port", str(self.port), "--model", model]
        self.process = subprocess.Popen(
            [*command, "--force-dummy-tokenizer", *flags],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(lambda: status(f"{self.url}/health/ready") == 200 or None, 20, "the simulator")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)


@contextlib.contextmanager
def sims(binary: Path, model: str, count: int, *flags: str) -> Iterator[list[Sim]]:
    started: list[Sim] = []
    try:
        for _ in range(count):
            started.append(Sim(binary, model, *flags))
        yield started
    finally:
        for sim in started:
            sim.kill()


class ThreadServer:
    """An ASGI app served by uvicorn on 127.0.0.1 in a thread of this process."""

    def __init__(self, app: ASGIApp) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.run(self.server.serve())

    def __enter__(self) -> ThreadServer:
        self.thread.start()
        wait_for(lambda: self.server.started or None, 10, "the server to start")
        return self

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def gateway(discovery: Discovery, **settings: Any) -> ThreadServer:
    """The gateway over `discovery`; settings default to a quick scrape and quick ejection."""
    values: dict[str, Any] = {"scrape_interval_seconds": 0.2, **settings}
    return ThreadServer(create_app(GatewaySettings(**values), discovery=discovery))
