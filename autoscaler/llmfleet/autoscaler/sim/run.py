"""The replay loop: arrivals, autoscaler ticks and pod transitions in time order.

Every event first advances every engine to its time, so routing and signals see the fleet as it
is then. Requests go through the gateway's own routing pipeline (`llmfleet.gateway.routing`, the
`prefix-load` profile unless `SimSettings.routing` names another): candidates are the serving
pods with their queue, running count, KV usage and in-flight requests and tokens. The in-flight
counts are the gateway's own (always current). The scraped figures (queue, running, KV) are read
at the moment of routing when `SimSettings.scrape_s` is 0 (an idealized gateway), else taken
from every serving pod at once every `scrape_s` seconds (so they are up to that old; a pod that
started serving since reads as zeros, as a new endpoint does until its first scrape), or never
(`math.inf`: in-flight counts only). With `gateway_replicas` above 1 the arrivals are spread
over that many gateway replicas in turn, each counting only its own requests in flight (what a
real replica knows) and routing with its own pipeline. A Mooncake request's prefix key is the
hash of its first 512-token block, the span the gateway hashes (8 blocks of 256 characters, ~4
characters a token); Azure requests have none, so only the load scorers decide. With no pod
serving the gateway holds requests until one is.

GPU-hours integrate the pods that exist from time 0 to the trace's last arrival (the same span
for every policy); requests still running then are followed to the end (at most `drain_s`).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from llmfleet.autoscaler.sim.controller import Controller, FastPath
from llmfleet.autoscaler.sim.engine import Recorder, Seq
from llmfleet.autoscaler.sim.fleet import Pod, PodState, Pool
from llmfleet.autoscaler.sim.model import EngineModel
from llmfleet.autoscaler.sim.observe import Meter, Observation
from llmfleet.autoscaler.sim.traces import Trace
from llmfleet.gateway.routing.base import Candidate, RoutingRequest
from llmfleet.gateway.routing.prefix_affinity import stable_hash
from llmfleet.gateway.routing.registry import PluginOptions, Scheduler

PREFIX_LOAD: Mapping[str, float] = {
    "prefix-affinity": 3.0,
    "queue-depth": 2.0,
    "kv-cache": 1.0,
    "inflight-tokens": 1.0,
}
"""The gateway's default `prefix-load` profile (gateway settings `DEFAULT_PROFILES`)."""


@dataclass(frozen=True)
class RoutingProfile:
    filters: tuple[str, ...]
    scorers: Mapping[str, float]
    picker: str


ROUTING_PROFILES: Mapping[str, RoutingProfile] = {
    "prefix-load": RoutingProfile(("healthy",), PREFIX_LOAD, "max-score"),
    "least-loaded": RoutingProfile(("healthy",), {"least-loaded": 1.0}, "max-score"),
    "round-robin": RoutingProfile(("healthy",), {}, "round-robin"),
}
"""The gateway's `DEFAULT_PROFILES`, spelt out here (the simulator may import the gateway's
routing plugins, not its settings; `tests/autoscaler/sim/test_routing.py` checks they agree)."""


@dataclass(frozen=True)
class Slo:
    ttft_ms: float
    itl_ms: float


@dataclass(frozen=True)
class SimSettings:
    slo: Slo
    model: EngineModel = field(default_factory=EngineModel)
    tick_s: float = 15.0
    """Autoscaler pass and Prometheus scrape interval."""
    rate_window_s: float = 60.0
    mean_window_s: float = 300.0
    drain_s: float = 900.0
    seed: int = 0
    routing: str = "prefix-load"
    """The gateway routing profile requests go through (`ROUTING_PROFILES`)."""
    scrape_s: float = 0.0
    """Age of the engines' scraped figures the gateway routes on: refreshed every `scrape_s`
    seconds (the gateway's `scrape_interval_seconds`, its `metrics_stale_seconds` assumed
    longer); 0: read at the moment of routing; `math.inf`: never (in-flight counts only)."""
    gateway_replicas: int = 1
    """Gateway replicas the arrivals are spread over in turn; each one's in-flight counts hold
    only its own requests."""


@dataclass(frozen=True)
class TimelinePoint:
    t: float
    arrival_rate: float
    prompt_tokens_rate: float
    active: int
    serving: int
    pods: int
    ttft_p95_ms: float | None
    itl_p95_ms: float | None


@dataclass
class RunResult:
    policy: str
    ttft_s: np.ndarray
    """Per request; inf for one that never got a first token."""
    tpot_s: np.ndarray
    """Per request: mean gap between its tokens; 0 for one-token answers, inf when unfinished."""
    itl_values: np.ndarray
    itl_weights: np.ndarray
    gpu_hours: float
    scale_events: int
    pods_created: int
    preemptions: int
    prefix_hit_share: float
    timeline: list[TimelinePoint]
    serving_log: list[tuple[float, int]]
    """(time, pods serving) at every change."""
    wall_s: float


def simulate(trace: Trace, controller: Controller, settings: SimSettings) -> RunResult:
    started = time.perf_counter()
    recorder = Recorder()
    active, spares = controller.start()
    prefix = any(r.blocks for r in trace.requests)
    pool = Pool(settings.model, recorder, prefix_cache=prefix, active=active, spares=spares)
    gateway = Gateway(
        trace,
        pool,
        seed=settings.seed,
        profile=ROUTING_PROFILES[settings.routing],
        scrape_s=settings.scrape_s,
        replicas=settings.gateway_replicas,
    )
    meter = Meter(
        recorder, rate_window_s=settings.rate_window_s, mean_window_s=settings.mean_window_s
    )
    seqs = gateway.seqs
    pool.on_serving = gateway.flush
    timeline: list[TimelinePoint] = []
    duration = trace.duration
    gpu_seconds: float | None = None
    n, i = len(seqs), 0
    fast = _fast_path(controller)
    next_tick, next_fast = settings.tick_s, fast.fast_interval_s if fast else math.inf
    while True:
        t_arrival = trace.requests[i].arrival if i < n else math.inf
        now = min(t_arrival, next_tick, next_fast, gateway.next_scrape, pool.next_event())
        if i >= n and not gateway.held and not any(p.engine.busy for p in pool.pods):
            break
        if now > duration + settings.drain_s:
            break
        if gpu_seconds is None and now >= duration:
            pool.account(duration)
            gpu_seconds = pool.gpu_seconds
        for pod in pool.pods:
            pod.engine.advance(now)
        if now == t_arrival:
            _arrive(trace, i, now, recorder, gateway)
            i += 1
            continue
        if now == gateway.next_scrape:
            gateway.scrape()
            continue
        if now == next_fast and fast is not None:
            next_fast += fast.fast_interval_s
            if now != next_tick:
                pool.set_target(*fast.decide_fast(meter.observe(now, pool)), now)
                continue
        if now == next_tick:
            next_tick += settings.tick_s
            meter.mark(now)
            observation = meter.observe(now, pool)
            active, spares = controller.decide(observation)
            pool.set_target(active, spares, now)
            timeline.append(_point(observation, pool))
        else:
            pool.reconcile(now)
    if gpu_seconds is None:
        pool.account(duration)
        gpu_seconds = pool.gpu_seconds
    return _result(
        controller.name,
        seqs=seqs,
        recorder=recorder,
        pool=pool,
        timeline=timeline,
        gpu_seconds=gpu_seconds,
        started=started,
    )


def _arrive(trace: Trace, index: int, now: float, recorder: Recorder, gateway: Gateway) -> None:
    """Request `index` arrives at `now`: recorded as the frontend sees it, then routed."""
    request = trace.requests[index]
    recorder.arrival_time.append(now)
    recorder.arrival_prompt.append(request.prompt_tokens)
    recorder.arrival_output.append(request.output_tokens)
    gateway.route(index, now)


def _point(observation: Observation, pool: Pool) -> TimelinePoint:
    return TimelinePoint(
        observation.now,
        observation.arrival_rate,
        observation.prompt_tokens_rate,
        pool.active,
        pool.count(PodState.SERVING),
        len(pool.pods),
        observation.ttft_p95_ms,
        observation.itl_p95_ms,
    )


def _fast_path(controller: Controller) -> FastPath | None:
    """The controller's fast pass, when it has one and it is on."""
    if isinstance(controller, FastPath) and controller.fast_interval_s > 0:
        return controller
    return None


class Gateway:
    """Routes each request with the gateway's pipeline; holds them while no pod serves."""

    def __init__(
        self,
        trace: Trace,
        pool: Pool,
        *,
        seed: int,
        profile: RoutingProfile,
        scrape_s: float = 0.0,
        replicas: int = 1,
    ) -> None:
        self.pool = pool
        self.routers = [
            Scheduler.build(
                list(profile.filters), profile.scorers, profile.picker, PluginOptions(seed=seed + r)
            )
            for r in range(replicas)
        ]
        self.seqs = [Seq(r) for r in trace.requests]
        self.keys = [
            stable_hash(str(r.blocks[0]).encode()) if r.blocks else None for r in trace.requests
        ]
        self.held: deque[int] = deque()
        self.live = scrape_s == 0
        """Scraped figures read at the moment of routing (else `figures`, from `scrape`)."""
        self.scrape_s = scrape_s
        self.next_scrape = scrape_s if 0 < scrape_s < math.inf else math.inf
        """When `scrape` is due next (the replay loop calls it then)."""
        self.figures: dict[str, tuple[float, float, float]] = {}
        """Pod name -> (waiting, running, KV usage) at the last scrape."""
        self.sent: list[dict[str, list[Seq]]] = [{} for _ in range(replicas)]
        """Per replica (with more than one): pod name -> the requests it sent there that have
        not finished (pruned when read)."""

    def scrape(self) -> None:
        """Every serving pod's figures, as one scrape of each would read them now (the engines
        advanced to `next_scrape`); the next one is due `scrape_s` later."""
        self.figures = {p.name: _figures(p) for p in self.pool.serving()}
        self.next_scrape += self.scrape_s

    def _in_flight(self, replica: int, pod: Pod) -> tuple[int, int]:
        """Requests and tokens `replica` has in flight to `pod` (all of them for one replica)."""
        if len(self.routers) == 1:
            return pod.engine.in_flight, pod.engine.in_flight_tokens
        sent = self.sent[replica].get(pod.name)
        if not sent:
            return 0, 0
        sent[:] = [seq for seq in sent if seq.finish == math.inf]
        return len(sent), sum(seq.tokens for seq in sent)

    def candidates(self, replica: int, serving: list[Pod]) -> list[Candidate]:
        """What gateway `replica` routes on: the serving pods' scraped figures (live, or as of
        the last scrape) and its own in-flight counts."""
        found = []
        for p in serving:
            if self.live:
                waiting, running, kv = _figures(p)
            else:
                waiting, running, kv = self.figures.get(p.name, (0.0, 0.0, 0.0))
            in_flight, tokens = self._in_flight(replica, p)
            found.append(
                Candidate(
                    url=p.name,
                    waiting=waiting,
                    running=running,
                    kv_usage=kv,
                    in_flight=in_flight,
                    in_flight_tokens=tokens,
                )
            )
        return found

    def route(self, index: int, now: float) -> None:
        serving = self.pool.serving()
        if not serving:
            self.held.append(index)
            return
        seq = self.seqs[index]
        replica = index % len(self.routers)
        request = RoutingRequest("sim", self.keys[index], seq.tokens)
        chosen = self.routers[replica].pick(request, self.candidates(replica, serving))
        assert chosen is not None
        pod = next(p for p in serving if p.name == chosen.url)
        pod.engine.add(seq, now)
        if len(self.routers) > 1 and seq not in pod.engine.rejected:  # a refusal is no flight
            self.sent[replica].setdefault(pod.name, []).append(seq)

    def flush(self, now: float) -> None:
        while self.held and self.pool.serving():
            self.route(self.held.popleft(), now)


def _figures(pod: Pod) -> tuple[float, float, float]:
    """What a scrape of `pod`'s engine reads now: waiting, running, KV usage."""
    engine = pod.engine
    return float(len(engine.waiting)), float(len(engine.running)), engine.kv_usage


def _result(
    name: str,
    *,
    seqs: list[Seq],
    recorder: Recorder,
    pool: Pool,
    timeline: list[TimelinePoint],
    gpu_seconds: float,
    started: float,
) -> RunResult:
    ttft = np.array([s.first_token - s.request.arrival for s in seqs])
    tpot = np.array(
        [
            math.inf
            if s.finish == math.inf
            else (s.finish - s.first_token) / max(s.request.output_tokens - 1, 1)
            for s in seqs
        ]
    )
    return RunResult(
        policy=name,
        ttft_s=ttft,
        tpot_s=tpot,
        itl_values=np.asarray(recorder.itl_value, dtype=float),
        itl_weights=np.asarray(recorder.itl_weight, dtype=float),
        gpu_hours=gpu_seconds / 3600.0,
        scale_events=pool.scale_events,
        pods_created=pool.created,
        preemptions=recorder.preemptions,
        prefix_hit_share=recorder.prefix_hit_tokens / max(recorder.prompt_tokens, 1),
        timeline=timeline,
        serving_log=pool.serving_log,
        wall_s=time.perf_counter() - started,
    )
