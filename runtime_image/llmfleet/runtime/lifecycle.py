"""The pod's life cycle around the engine process.

    starting --engine healthy--> warming --warm-up done--> ready --SIGTERM--> draining --> stopped

- starting: the engine process loads; the front answers 503 on everything but liveness.
- warming: the warm-up (warmup.py) runs against the engine directly; still not ready.
- ready: `/health/ready` is 200 and the front forwards traffic.
- draining (SIGTERM): readiness is 503 and new requests get 503 at once, so the endpoint leaves
  the Service and the gateway retries elsewhere; requests already in flight run on until both
  the front's count and the engine's `vllm:num_requests_running + waiting` are zero, or until
  `serving.drainGraceSeconds`. Then the engine gets SIGTERM (SIGKILL 10 s later).

Exit codes (errors.ExitCode): 0 after a clean drain (or SIGTERM before ready), DRAIN_TIMEOUT when
requests were cut off, ENGINE_FAILED when the engine exits or never gets healthy, WARMUP_FAILED.
The last log line says which, in words.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import httpx
import uvicorn

from llmfleet.core import loopback
from llmfleet.core.loopback import LoopbackGuard, guarded
from llmfleet.runtime import metrics
from llmfleet.runtime.args import EnginePlan
from llmfleet.runtime.config import RuntimeConfig
from llmfleet.runtime.errors import ExitCode, LauncherError
from llmfleet.runtime.front import Gate, Phase, StreamCutOffError, create_front
from llmfleet.runtime.warmup import run_warmup

log = logging.getLogger("llmfleet.runtime")

POLL_SECONDS = 0.1
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# After SIGTERM the engine gets this long to exit before SIGKILL: vLLM frees GPU memory and
# joins its worker processes on shutdown, which takes a few seconds on multi-GPU engines.
ENGINE_STOP_SECONDS = 10.0

T = TypeVar("T")


class _Front(uvicorn.Server):
    """uvicorn without its own signal handlers (SIGTERM belongs to the supervisor), and whose
    failure to bind ends its task instead of the process (uvicorn calls `sys.exit`)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().startup(sockets)
        except SystemExit:
            self.should_exit = True


def _prctl() -> Callable[..., int] | None:
    with contextlib.suppress(OSError, AttributeError):
        prctl: Callable[..., int] = ctypes.CDLL(None).prctl
        return prctl
    return None


# Looked up in the launcher, so the forked child only calls a function pointer (no dlopen
# between fork and exec).
_PRCTL = _prctl()


def _die_with_parent() -> None:
    """Runs in the engine's process before exec: if the launcher dies without stopping it
    (SIGKILL, OOM), the kernel kills the engine too (Linux `PR_SET_PDEATHSIG`), so it never
    outlives its supervisor holding GPUs and a port."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL)


class _QuietCutOffs(logging.Filter):
    """Streams cut at the end of the grace period are expected; the drain logs them once."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], StreamCutOffError))


class _Stopped(Exception):
    """SIGTERM/SIGINT arrived before the pod was ready."""


class Supervisor:
    def __init__(
        self, config: RuntimeConfig, plan: EnginePlan, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config
        self.plan = plan
        self.clock = clock
        self.gate = Gate()
        self.stop = asyncio.Event()
        self.engine_url = f"http://127.0.0.1:{config.serving.engine_port}"
        self.served_name = config.model.served_name or config.model.name

    async def run(self) -> ExitCode:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        started = self.clock()
        serving = self.config.serving
        # The engine is on 127.0.0.1 by construction; the guard keeps it so if that changes.
        transport = guarded(None, LoopbackGuard(loopback.enabled()), "engine")
        async with httpx.AsyncClient(
            base_url=self.engine_url, timeout=None, transport=transport
        ) as client:
            front = _Front(
                uvicorn.Config(
                    create_front(self.gate, client),
                    host=serving.host,
                    port=serving.port,
                    log_level="warning",
                    lifespan="off",
                    timeout_graceful_shutdown=2,
                )
            )
            logging.getLogger("uvicorn.error").addFilter(_QuietCutOffs())
            # The front first: a pod that cannot serve its port should not load a model.
            front_task = asyncio.create_task(front.serve())
            while not front.started and not front_task.done():
                await asyncio.sleep(0.01)
            if not front.started:
                # uvicorn has logged why (typically "address already in use").
                await front_task
                where = f"{serving.host}:{serving.port}"
                log.error("cannot serve on %s (see above); exit %d", where, ExitCode.FRONT_FAILED)
                return ExitCode.FRONT_FAILED
            code = await self._with_engine(client, started)
            front.should_exit = True
            await front_task
        log.info("exit %d (%s)", code, code.name)
        return code

    async def _with_engine(self, client: httpx.AsyncClient, started: float) -> ExitCode:
        log.info("starting engine: %s", " ".join(self.plan.argv))
        try:
            engine = await asyncio.create_subprocess_exec(
                *self.plan.argv,
                env={**os.environ, **self.plan.env},
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        except OSError as error:
            log.error("engine command %s cannot start: %s", self.plan.argv[0], error.strerror)
            return ExitCode.ENGINE_FAILED
        try:
            return await self._life(engine, client, started)
        except LauncherError as error:
            log.error("%s", error)
            return error.code
        finally:
            self.gate.phase = Phase.STOPPED
            await self._stop_engine(engine)

    def _on_signal(self, sig: int) -> None:
        log.info("received %s", signal.Signals(sig).name)
        self.stop.set()

    async def _life(
        self, engine: asyncio.subprocess.Process, client: httpx.AsyncClient, started: float
    ) -> ExitCode:
        try:
            await self._until(
                self._healthy(client), engine, self.config.serving.startup_timeout_seconds
            )
            log.info("engine healthy after %.1fs; warming up", self.clock() - started)
            self.gate.phase = Phase.WARMING
            warmup = self.config.warmup
            sent = await self._until(
                run_warmup(client, self.served_name, warmup), engine, warmup.timeout_seconds
            )
        except _Stopped:
            log.info("stopped during %s, before the pod was ready", self.gate.phase.value)
            return ExitCode.OK
        self.gate.phase = Phase.READY
        log.info("ready after %.1fs (warm-up: %d requests)", self.clock() - started, sent)
        stop = asyncio.create_task(self.stop.wait())
        exited = asyncio.create_task(engine.wait())
        await asyncio.wait({stop, exited}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if exited.done():
            raise LauncherError(
                ExitCode.ENGINE_FAILED, f"engine exited with code {exited.result()} while serving"
            )
        exited.cancel()
        return await self._drain(client)

    async def _until(
        self, work: Awaitable[T], engine: asyncio.subprocess.Process, timeout: float
    ) -> T:
        """Run `work` unless the engine exits, a stop signal comes, or `timeout` passes."""
        phase = self.gate.phase.value
        task = asyncio.ensure_future(work)
        stop = asyncio.create_task(self.stop.wait())
        exited = asyncio.create_task(engine.wait())
        try:
            await asyncio.wait(
                {task, stop, exited}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if task.done():
                return task.result()
            if stop.done():
                raise _Stopped
            if exited.done():
                code = ExitCode.ENGINE_FAILED
                raise LauncherError(
                    code, f"engine exited with code {exited.result()} while {phase}"
                )
            code = ExitCode.ENGINE_FAILED if phase == "starting" else ExitCode.WARMUP_FAILED
            raise LauncherError(code, f"engine still {phase} after {timeout:g}s; giving up")
        finally:
            for pending in (task, stop, exited):
                pending.cancel()

    async def _healthy(self, client: httpx.AsyncClient) -> None:
        """Poll until `/health` is 200 and `/health/ready`, where the engine has it, too."""
        while True:
            with contextlib.suppress(httpx.HTTPError):
                health = await client.get("/health", timeout=2)
                if health.status_code == 200:
                    ready = await client.get("/health/ready", timeout=2)
                    if ready.status_code in (200, 404):
                        return
            await asyncio.sleep(POLL_SECONDS)

    async def _busy(self, client: httpx.AsyncClient) -> int:
        """Requests still held: the front's own count, or the engine's gauges if higher."""
        engine_count: int | None = None
        with contextlib.suppress(httpx.HTTPError):
            response = await client.get("/metrics", timeout=2)
            if response.status_code == 200:
                engine_count = metrics.requests_in_engine(response.text)
        return max(self.gate.in_flight, engine_count or 0)

    async def _drain(self, client: httpx.AsyncClient) -> ExitCode:
        self.gate.phase = Phase.DRAINING
        grace = self.config.serving.drain_grace_seconds
        deadline = self.clock() + grace
        busy = await self._busy(client)
        log.info("draining: %d requests in flight, grace %gs", busy, grace)
        while busy > 0 and self.clock() < deadline:
            await asyncio.sleep(POLL_SECONDS)
            busy = await self._busy(client)
        if busy > 0:
            log.warning(
                "drain: %d requests still in flight after %gs; cutting them off", busy, grace
            )
            return ExitCode.DRAIN_TIMEOUT
        log.info("drained: no requests in flight")
        return ExitCode.OK

    async def _stop_engine(self, engine: asyncio.subprocess.Process) -> None:
        if engine.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(engine.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(engine.wait(), ENGINE_STOP_SECONDS)
        except TimeoutError:
            log.warning("engine ignored SIGTERM for %gs; killing it", ENGINE_STOP_SECONDS)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(engine.pid, signal.SIGKILL)
            await engine.wait()
        log.info("engine stopped (code %s)", engine.returncode)


def identity(config: RuntimeConfig, environ: dict[str, str]) -> str:
    """Who is logging: service, pod (downward-API env `POD_NAMESPACE`/`POD_NAME`), model, role."""
    pod = "/".join(environ[k] for k in ("POD_NAMESPACE", "POD_NAME") if environ.get(k))
    service = "/".join(part for part in (config.namespace, config.service) if part)
    model = config.model.served_name or config.model.name
    parts = [f"service={service}" if service else "", f"pod={pod}" if pod else ""]
    return " ".join([*filter(None, parts), f"model={model} role={config.role.value}"])


def run_serving(config: RuntimeConfig, plan: EnginePlan) -> ExitCode:
    who = identity(config, dict(os.environ)).replace("%", "%%")
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s llmfleet-runtime {who} %(levelname)s %(message)s"
    )
    # httpx logs every request at INFO; the drain polls /metrics ten times a second.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    return asyncio.run(Supervisor(config, plan).run())
