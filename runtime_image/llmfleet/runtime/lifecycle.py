"""The pod's life cycle around the engine process.

    starting --engine healthy--> warming --warm-up done--> ready
        --/drain or SIGTERM--> draining --SIGTERM--> stopped

The engine serves the pod's port itself (`serving.port`) and every request goes to it directly;
the launcher answers only on its side port (side_port.py) and never carries a request.

- starting: the engine process loads; `/ready` is 503.
- warming: the warm-up (warmup.py) runs against the engine; still not ready.
- ready: `/ready` is 200, so the pod joins its Service's endpoints.
- draining: begun by the preStop hook's `GET /drain`, or by SIGTERM when nothing called it.
  `/ready` turns 503 at once, so Kubernetes drops the pod from the EndpointSlices and the gateway
  stops sending it requests. The drain then waits until the engine's
  `vllm:num_requests_running + waiting` is 0, at least `serving.drainSettleSeconds` (requests
  sent before the news reached the gateway are waited for too) and at most
  `serving.drainGraceSeconds`, and `/drain` answers. The engine keeps running until SIGTERM
  (which the kubelet sends once the hook has answered); then it gets SIGTERM itself (SIGKILL
  after `serving.engineStopSeconds`), which cuts off whatever outlived the grace.
- stopped: the engine is stopped, or stopping; the launcher exits.

Exit codes (errors.ExitCode): 0 after a clean drain (or SIGTERM before ready), DRAIN_TIMEOUT when
requests were still in flight at the drain's end, ENGINE_FAILED when the engine exits or never
gets healthy, WARMUP_FAILED, SIDE_PORT_FAILED. The last log line says which, in words.
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
from llmfleet.runtime.redact import redact_argv, secret_values
from llmfleet.runtime.side_port import Gate, Phase, create_side_app
from llmfleet.runtime.warmup import run_warmup

log = logging.getLogger("llmfleet.runtime")

POLL_SECONDS = 0.1
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

T = TypeVar("T")


class _SidePort(uvicorn.Server):
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
        # The engine binds 0.0.0.0 or 127.0.0.1 (config.Serving.host): loopback reaches it.
        self.engine_url = f"http://127.0.0.1:{config.serving.port}"
        self.served_name = config.model.served_name or config.model.name
        self._drain_task: asyncio.Task[int | None] | None = None

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
            side = _SidePort(
                uvicorn.Config(
                    create_side_app(self.gate, lambda: self.drain(client)),
                    host=serving.host,
                    port=serving.launcher_port,
                    log_level="warning",
                    lifespan="off",
                    timeout_graceful_shutdown=2,
                )
            )
            # The side port first: a pod whose readiness cannot be answered should not load a
            # model.
            side_task = asyncio.create_task(side.serve())
            while not side.started and not side_task.done():
                await asyncio.sleep(0.01)
            if not side.started:
                # uvicorn has logged why (typically "address already in use").
                await side_task
                where = f"{serving.host}:{serving.launcher_port}"
                code = ExitCode.SIDE_PORT_FAILED
                log.error("cannot serve the side port on %s (see above); exit %d", where, code)
                return code
            code = await self._with_engine(client, started)
            if self._drain_task is not None:
                self._drain_task.cancel()  # under way only when the engine failed meanwhile
            side.should_exit = True
            await side_task
        log.info("exit %d (%s)", code, code.name)
        return code

    async def _with_engine(self, client: httpx.AsyncClient, started: float) -> ExitCode:
        # The whole command line, secrets taken out (redact.py).
        secrets = secret_values(os.environ, self.plan.env)
        log.info("starting engine: %s", " ".join(redact_argv(self.plan.argv, secrets)))
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

    def _advance(self, phase: Phase) -> None:
        """Move on to `phase`, unless the drain has begun: a pod going away never turns ready."""
        if self.gate.phase not in (Phase.DRAINING, Phase.STOPPED):
            self.gate.phase = phase

    async def _life(
        self, engine: asyncio.subprocess.Process, client: httpx.AsyncClient, started: float
    ) -> ExitCode:
        try:
            await self._until(
                self._healthy(client), engine, self.config.serving.startup_timeout_seconds
            )
            log.info("engine healthy after %.1fs; warming up", self.clock() - started)
            self._advance(Phase.WARMING)
            warmup = self.config.warmup
            sent = await self._until(
                run_warmup(client, self.served_name, warmup), engine, warmup.timeout_seconds
            )
        except _Stopped:
            log.info("stopped during %s, before the pod was ready", self.gate.phase.value)
            return ExitCode.OK
        self._advance(Phase.READY)
        if self.gate.phase is Phase.READY:
            log.info("ready after %.1fs (warm-up: %d requests)", self.clock() - started, sent)
        else:
            log.info("warmed up, but the drain has begun: the pod stays out of traffic")
        stop = asyncio.create_task(self.stop.wait())
        exited = asyncio.create_task(engine.wait())
        await asyncio.wait({stop, exited}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if exited.done():
            raise LauncherError(
                ExitCode.ENGINE_FAILED, f"engine exited with code {exited.result()} while serving"
            )
        exited.cancel()
        in_flight = await self.drain(client)
        return ExitCode.OK if in_flight == 0 else ExitCode.DRAIN_TIMEOUT

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

    async def _in_flight(self, client: httpx.AsyncClient) -> int | None:
        """The engine's running + waiting requests; None when it does not say (no answer, or no
        such gauges), which the drain counts as busy."""
        with contextlib.suppress(httpx.HTTPError):
            response = await client.get("/metrics", timeout=2)
            if response.status_code == 200:
                return metrics.requests_in_engine(response.text)
        return None

    def drain(self, client: httpx.AsyncClient) -> asyncio.Task[int | None]:
        """The pod's one drain: begun by the first caller (the preStop hook's `/drain`, or
        SIGTERM), joined by every later one. Its result: the requests still in the engine at its
        end (0: drained; None: the engine never said)."""
        if self._drain_task is None:
            self._drain_task = asyncio.create_task(self._drain(client))
        return self._drain_task

    async def _drain(self, client: httpx.AsyncClient) -> int | None:
        was_ready = self.gate.phase is Phase.READY
        self.gate.phase = Phase.DRAINING
        if not was_ready:
            # Never ready, never in an EndpointSlice: no client can have found the engine.
            log.info("draining before the pod was ready: nothing can be in flight")
            return 0
        serving = self.config.serving
        grace = serving.drain_grace_seconds
        begun = self.clock()
        settled, deadline = begun + serving.drain_settle_seconds, begun + grace
        in_flight = await self._in_flight(client)
        log.info("draining: %s requests in flight, grace %gs", _said(in_flight), grace)
        while (in_flight != 0 or self.clock() < settled) and self.clock() < deadline:
            await asyncio.sleep(POLL_SECONDS)
            in_flight = await self._in_flight(client)
        if in_flight == 0:
            log.info("drained after %.1fs: no requests in flight", self.clock() - begun)
        else:
            log.warning(
                "drain: %s requests still in flight after %gs; stopping the engine cuts them off",
                _said(in_flight), grace,
            )  # fmt: skip
        return in_flight

    async def _stop_engine(self, engine: asyncio.subprocess.Process) -> None:
        if engine.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(engine.pid, signal.SIGTERM)
        patience = self.config.serving.engine_stop_seconds
        try:
            await asyncio.wait_for(engine.wait(), patience)
        except TimeoutError:
            log.warning("engine ignored SIGTERM for %gs; killing it", patience)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(engine.pid, signal.SIGKILL)
            await engine.wait()
        log.info("engine stopped (code %s)", engine.returncode)


def _said(in_flight: int | None) -> str:
    return "unknown (the engine does not say)" if in_flight is None else str(in_flight)


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
