"""One autoscaler pass: for every autoscaled InferenceService, read its pods and signals, run the
policy, and write the decision to `status.autoscaling` (the operator acts on it).

The policy's memory (`PolicyState`: rate averages, learnt corrections, scale-down timers) lives
here, keyed by the service's uid, so a service deleted and created again starts afresh. A restart
forgets it: the averages start again from the current rate and a due scale-down waits one more
stabilisation window; the counts themselves are read back from `status.autoscaling`, and so is
what the policy measured for the floors it chooses (`floor.py`; `decision.remembered`), so a pool
measured light stays at one replica.

Each service's spec and `status.autoscaling` are parsed (validated, with the CRD's cross-field
rules) when they change, not on every pass (`Parsed`): at 1,000 services that parse was most of
a pass's own CPU (bench/autoscaler_pass_client.py).

A pass decides every service first, then writes the statuses that changed, a few at once
(`write_concurrency`); events and log lines follow, in the services' order. A pass may have
much of the fleet to write with no pool's count changing: its first after an install (every
service's first decision), or when the signals go away for every service, and again when they
come back. Each write costs the API server ~20 ms of CPU and wakes the operator, so 1,000 of them
held a pass, and the fast passes behind it, for 102 s (bench/control_plane_scale.py). So a full
pass writes every decision that changes a pool's target (`pods.targets`) first, then starts the
others only within `other_writes_seconds` of its writes' start (one at least, so all of them
get written, pass after pass); a fast pass writes only the former.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Protocol

from pydantic import ValidationError

from llmfleet.autoscaler.decision import Decision, parse_time, remembered
from llmfleet.autoscaler.inputs import (
    PolicyConfig,
    PolicyState,
    PoolInputs,
    PoolSignals,
    ServiceInputs,
)
from llmfleet.autoscaler.kube import Kube
from llmfleet.autoscaler.metrics import AutoscalerMetrics
from llmfleet.autoscaler.pods import PodView, pool_pods, targets
from llmfleet.autoscaler.policy import decide, decide_fast
from llmfleet.core.capacity_profile import CapacityProfile
from llmfleet.crds.inference_service import AutoscalingStatus, FloorMemory, InferenceServiceSpec

log = logging.getLogger("llmfleet.autoscaler")
_CAUSE_CHARS = 200
"""How much of the signals backend's error a reason quotes (the log has all of it)."""


ServiceKey = tuple[str, str]
"""(namespace, name) of an InferenceService."""


class SignalSource(Protocol):
    def read_services(
        self, wanted: Mapping[ServiceKey, Sequence[str]]
    ) -> Mapping[ServiceKey, Mapping[str, PoolSignals] | Exception]:
        """Signals per pool of every service in `wanted` (service -> its pools); a pool without
        series is absent. A service whose part of the read failed maps to its error (its pools
        hold, the others' decisions go on); raises when the backend cannot be asked at all (the
        caller then holds every pool)."""
        ...

    def read_services_gauges(
        self, wanted: Mapping[ServiceKey, Sequence[str]]
    ) -> Mapping[ServiceKey, Mapping[str, PoolSignals]]:
        """Only the instant gauges (running, waiting, KV-cache usage, their sample time), for
        the fast pass; one read, raising when the backend cannot be asked."""
        ...


class Said:
    """Warnings said while their cause lasts: each key's line is logged when the cause appears
    and once more when it ends, not on every pass (a Prometheus down for an hour is two lines,
    not one per 15 s)."""

    def __init__(self) -> None:
        self._standing: dict[str, str] = {}
        self._this_pass: dict[str, str] = {}

    def warn(self, key: str, line: str) -> None:
        self._this_pass[key] = line
        if key not in self._standing:
            log.warning("%s", line)

    def end_pass(self) -> None:
        for key in self._standing.keys() - self._this_pass.keys():
            log.info("resolved: %s", self._standing[key])
        self._standing, self._this_pass = self._this_pass, {}


@dataclass(frozen=True)
class _Candidate:
    """An autoscaled service of this pass, its spec and status parsed."""

    body: dict[str, Any]
    spec: InferenceServiceSpec
    current: AutoscalingStatus | None

    @property
    def key(self) -> ServiceKey:
        return (self.body["metadata"]["namespace"], self.body["metadata"]["name"])

    @property
    def uid(self) -> str:
        return str(self.body["metadata"].get("uid", ""))


@dataclass(frozen=True)
class Outcome:
    namespace: str
    name: str
    decision: Decision
    written: bool


BUSY_GRAIN_SECONDS = 300.0
"""How finely a written decision keeps a pool's floor memory's `busyAt` (floor.py): a busy pool
rewrites its status once per grain, not once per pass. A restarted autoscaler may so find the
pool up to this much quieter than it was, against the 30 min it must be quiet to drop a floor."""


def _counts(status: AutoscalingStatus | None) -> object:
    """What of a decision is worth a write when it changes (the reasons and SLO misses are
    not: their figures move every pass)."""
    if status is None:
        return None
    pools = {
        name: (p.active, p.spares, _floor_key(p.floor_memory)) for name, p in status.pools.items()
    }
    missing = (status.metrics_missing_since, status.metrics_missing_pools)
    return pools, status.limited, status.message, missing


def _floor_key(memory: FloorMemory | None) -> object:
    if memory is None:
        return None
    busy = parse_time(memory.busy_at) if memory.busy_at else None
    grain = None if busy is None else int(busy.timestamp() // BUSY_GRAIN_SECONDS)
    return memory.observed_since, memory.longest_lull_seconds, grain


def _metrics_missing(
    status: AutoscalingStatus,
    current: AutoscalingStatus | None,
    missing: list[str] | None,
    now: datetime,
) -> AutoscalingStatus:
    """`status` with `metricsMissingSince`/`metricsMissingPools`: the pools with Ready pods
    and no engine series in this full pass, since the first pass in a row that found any;
    `missing` None (a fast pass): as `current` says."""
    kept = current.metrics_missing_since if current is not None else None
    if missing is None:
        pools = current.metrics_missing_pools if current is not None else None
        return status.model_copy(
            update={"metrics_missing_since": kept, "metrics_missing_pools": pools}
        )
    if not missing:
        return status
    since = kept or now.astimezone(UTC).isoformat().replace("+00:00", "Z")
    return status.model_copy(
        update={"metrics_missing_since": since, "metrics_missing_pools": missing}
    )


class Autoscaler:
    def __init__(
        self,
        kube: Kube,
        signals: SignalSource,
        metrics: AutoscalerMetrics,
        *,
        profiles: Mapping[str, CapacityProfile] | None = None,
        config: PolicyConfig | None = None,
        status_refresh_seconds: float | None = None,
        write_concurrency: int = 1,
        other_writes_seconds: float | None = None,
    ) -> None:
        self.kube = kube
        self.signals = signals
        self.metrics = metrics
        self.profiles = dict(profiles or {})
        self.config = config or PolicyConfig()
        self.status_refresh_seconds = status_refresh_seconds
        self.write_concurrency = write_concurrency
        """Status writes of a pass in flight at once (1: in the pass's own thread, one after the
        other; `AutoscalerSettings.status_write_concurrency` is the command's)."""
        self.other_writes_seconds = other_writes_seconds
        """How long after a full pass's writes start it may still start one that changes no
        pool's target (None: no bound; `AutoscalerSettings.status_other_writes_seconds` is the
        command's)."""
        self.states: dict[str, PolicyState] = {}
        self.said = Said()
        self.parsed = Parsed()
        self.last_signals: dict[str, Mapping[str, PoolSignals]] = {}
        """The last full pass's signals per service uid: what a fast pass updates the gauges of."""

    def run_once(self, now: datetime) -> list[Outcome]:
        """The full pass: every signal, the policy's learning and every scaling direction."""
        return self._pass(now, fast=False)

    def run_fast(self, now: datetime) -> list[Outcome]:
        """The fast pass between full ones (`policy.decide_fast`): fresh gauges on the last
        full pass's rates, scale-ups only. A service no full pass has read yet is skipped."""
        return self._pass(now, fast=True)

    def _pass(self, now: datetime, *, fast: bool) -> list[Outcome]:
        started = time.perf_counter()
        try:
            services = self.kube.list_services()
            pods = self.kube.list_pods()
        except Exception:
            self.metrics.errors.labels("list").inc()
            raise
        seen: set[str] = set()
        candidates: list[_Candidate] = []
        for body in services:
            metadata = body["metadata"]
            if metadata.get("deletionTimestamp"):
                continue
            spec_body = body.get("spec") or {}
            if not (spec_body.get("autoscaling") or {}).get("enabled"):
                continue
            uid = str(metadata.get("uid", ""))
            seen.add(uid)
            if fast and uid not in self.last_signals:
                continue
            candidate = self.parsed.candidate(body)
            if isinstance(candidate, str):
                self.said.warn(f"spec {uid}", candidate)
            else:
                candidates.append(candidate)
        signals = self._read(candidates, fast=fast)
        outcomes = self._act(candidates, pods, signals, now, fast=fast)
        self.said.end_pass()
        for uid in set(self.states) - seen:
            del self.states[uid]
        for uid in set(self.last_signals) - seen:
            del self.last_signals[uid]
        self.parsed.keep_only(seen)
        self.metrics.pass_seconds.labels("fast" if fast else "full").observe(
            time.perf_counter() - started
        )
        return outcomes

    def _act(
        self,
        candidates: Sequence[_Candidate],
        pods: Mapping[ServiceKey, list[PodView]],
        signals: Mapping[ServiceKey, Mapping[str, PoolSignals] | Exception] | Exception,
        now: datetime,
        *,
        fast: bool,
    ) -> list[Outcome]:
        """Every candidate decided, then the statuses that changed written (`_write`), then
        their events, in the candidates' order. A service whose decision or write failed is
        left out (logged and counted; the next pass tries again). Of the writes that change no
        pool's target, those past `other_writes_seconds` are left to later passes
        (`writes_deferred`), each of which finds them still to write until one writes them; a
        fast pass leaves them all."""
        decided: list[tuple[_Candidate, Decision, dict[str, Any] | None, bool]] = []
        for candidate in candidates:
            try:
                decision, patch, acts = self._decide(
                    candidate, pods.get(candidate.key, []), signals, now, fast=fast
                )
            except Exception:
                log.exception("autoscaling %s/%s failed", *candidate.key)
                self.metrics.errors.labels("write").inc()
                continue
            decided.append((candidate, decision, patch, acts))
        outcomes: list[Outcome] = []
        # A fast pass acts; what changes no target waits for a full pass.
        writes = self._write([(c.key, patch, acts) for c, _, patch, acts in decided], not fast)
        self.metrics.writes_deferred.set(sum(written is None for written in writes))
        for (candidate, decision, _, _), written in zip(decided, writes, strict=True):
            if isinstance(written, Exception):
                log.error("autoscaling %s/%s failed", *candidate.key, exc_info=written)
                self.metrics.errors.labels("write").inc()
                continue
            if written:
                self._report_changes(candidate.body, candidate.current, decision)
            outcomes.append(Outcome(*candidate.key, decision, bool(written)))
        return outcomes

    def _read(
        self, candidates: Sequence[_Candidate], *, fast: bool
    ) -> Mapping[ServiceKey, Mapping[str, PoolSignals] | Exception] | Exception:
        """Every candidate's signals in one read of the backend (its error, for every service
        to hold on: fail-static; a service's own error, for its pools to hold on). A pass with
        any error counts one `signals` error."""
        if not candidates:
            return {}
        wanted = {c.key: list(c.spec.pools()) for c in candidates}
        try:
            if fast:
                return self.signals.read_services_gauges(wanted)
            read = self.signals.read_services(wanted)
        except Exception as error:  # the backend is down: every pool holds (fail-static)
            self.said.warn("signals", f"signals unavailable, every pool holds: {error}")
            self.metrics.errors.labels("signals").inc()
            return error
        failed = [found for found in read.values() if isinstance(found, Exception)]
        if failed:
            self.said.warn(
                "signals",
                f"signals unavailable for {len(failed)} of {len(read)} services, their pools "
                f"hold: {failed[0]}",
            )
            self.metrics.errors.labels("signals").inc()
        return read

    def _decide(
        self,
        candidate: _Candidate,
        pods: list[PodView],
        read: Mapping[ServiceKey, Mapping[str, PoolSignals] | Exception] | Exception,
        now: datetime,
        *,
        fast: bool,
    ) -> tuple[Decision, dict[str, Any] | None, bool]:
        """The service's decision, the merge patch of its status to write (None: nothing to
        write), and whether that write changes what the operator runs towards (a pool's serving
        count or spares, `pods.targets`)."""
        spec, current, uid = candidate.spec, candidate.current, candidate.uid
        namespace, name = candidate.key
        pools = list(spec.pools())
        signals: Mapping[str, PoolSignals]
        found = read if isinstance(read, Exception) else read.get(candidate.key, {})
        if isinstance(found, Exception):
            signals, missing_cause = {}, "unavailable"
            missing = f"signals unavailable: {str(found)[:_CAUSE_CHARS]}"
        else:
            if fast:
                signals = _with_gauges(self.last_signals[uid], found)
            else:
                signals = dict(found)
                self.last_signals[uid] = signals
            missing_cause, missing = "no-series", ""

        profile = self.profiles.get(spec.model.name)
        counted = pool_pods(spec, current, pods)
        inputs = ServiceInputs(
            spec=spec,
            pools={
                pool: PoolInputs(counted[pool], signals.get(pool), profile, missing)
                for pool in pools
            },
        )
        # A service this process has not sized yet starts from what status.autoscaling kept of
        # its floors (after a restart), never from nothing when something was measured.
        state = self.states.get(uid) or remembered(current)
        if fast:
            decision = decide_fast(inputs, state, now, self.config)
        else:
            decision = decide(inputs, state, now, self.config)
            self.states[uid] = decision.state

        # NOTE: a pool whose pods are Ready has engines that serve /metrics; no series for it
        # means Prometheus does not scrape them (a ServiceMonitor its selector does not match,
        # a NetworkPolicy that refuses it) or cannot be asked at all. A fast pass reads gauges
        # only: what the last full pass found stands.
        without = None if fast else [p for p in pools if p not in signals and counted[p].ready]
        status = _metrics_missing(decision.status(), current, without, now)
        for pool, plan in decision.pools.items():
            labels = (namespace, name, pool)
            self.metrics.desired_replicas.labels(*labels).set(plan.active)
            self.metrics.desired_spares.labels(*labels).set(plan.spares)
            if plan.floor is not None:
                self.metrics.floor_replicas.labels(*labels).set(plan.floor)
            if pool not in signals:
                self.metrics.signals_missing.labels(*labels, missing_cause).inc()
        self.metrics.limited.labels(namespace, name).set(1 if decision.limited else 0)

        last = parse_time(current.last_decision_time) if current else None
        refresh = self.status_refresh_seconds
        due = (
            not fast
            and refresh is not None
            and (last is None or (now - last).total_seconds() >= refresh)
        )
        if _counts(current) == _counts(status) and not due:
            return decision, None, False
        return decision, _patch(status, current), targets(spec, status) != targets(spec, current)

    def _write(
        self, patches: Sequence[tuple[ServiceKey, dict[str, Any] | None, bool]], others: bool
    ) -> list[bool | Exception | None]:
        """Each service's status patch (None: nothing to write) written, up to
        `write_concurrency` at once: those that change a target (the bool) first, then, with
        `others`, the others while within `other_writes_seconds` of the start (one at least,
        so that every one is written in a few passes). Per service, in
        `patches`' order: whether it was written (False: nothing to write, or the service is
        gone), the error its write raised, or None when it was left to a later pass."""
        deadline = (
            None if self.other_writes_seconds is None
            else time.monotonic() + self.other_writes_seconds
        )  # fmt: skip
        lock = threading.Lock()
        started = 0  # writes that change no target, started

        def one(item: tuple[ServiceKey, dict[str, Any] | None, bool]) -> bool | Exception | None:
            nonlocal started
            (namespace, name), patch, acts = item
            if patch is None:
                return False
            if not acts:
                with lock:
                    late = deadline is not None and time.monotonic() >= deadline
                    if not others or (started and late):
                        return None
                    started += 1
            try:
                return self.kube.write_autoscaling(namespace, name, patch)
            except Exception as error:  # this service's decision is retried by the next pass
                return error

        order = sorted(range(len(patches)), key=lambda index: not patches[index][2])
        found: list[bool | Exception | None] = [False] * len(patches)
        # What may be written: a fast pass starts no thread for writes it leaves to later.
        writes = sum(patch is not None and (acts or others) for _, patch, acts in patches)
        if min(self.write_concurrency, writes) < 2:
            for index in order:
                found[index] = one(patches[index])
            return found
        # Threads for this pass only: most passes write nothing, and none are left behind.
        with ThreadPoolExecutor(min(self.write_concurrency, writes), "status-write") as writers:
            for index, written in zip(
                order, writers.map(one, [patches[i] for i in order]), strict=True
            ):
                found[index] = written
        return found

    def _report_changes(
        self, body: dict[str, Any], current: AutoscalingStatus | None, decision: Decision
    ) -> None:
        metadata = body["metadata"]
        before = current.pools if current else {}
        for pool, plan in decision.pools.items():
            old = before.get(pool)
            if old is None or old.active == plan.active:
                continue
            direction = "up" if plan.active > old.active else "down"
            self.metrics.scale_events.labels(
                metadata["namespace"], metadata["name"], pool, direction
            ).inc()
            message = f"{pool}: {old.active} -> {plan.active} serving replicas: {plan.reason}"
            log.info("%s/%s %s", metadata["namespace"], metadata["name"], message)
            try:
                self.kube.event(body, "Scaled", message)
            except Exception:  # an event is a courtesy; the decision is written already
                log.exception("could not record the Scaled event")
        if decision.limited and not (current and current.limited):
            log.warning(
                "%s/%s limited: %s", metadata["namespace"], metadata["name"], decision.message
            )


class Parsed:
    """Each service's spec and `status.autoscaling` as last parsed, by uid, with a copy of the
    JSON each was parsed from: a pass parses again only the part of a service that changed
    (a status write changes `status.autoscaling` alone, and its parse is the cheap one).

    NOTE: the key is the JSON's content, compared with a copy taken at the parse, not a
    resourceVersion or generation: a body without them (a test's), or one changed in place,
    is parsed again all the same, and an equal JSON parses to an equal model (the models are
    frozen, so one parse serves every pass). A body that does not parse is not kept: it is
    parsed, and its warning said, on every pass."""

    def __init__(self) -> None:
        self._specs: dict[str, tuple[Any, InferenceServiceSpec]] = {}
        self._statuses: dict[str, tuple[Any, AutoscalingStatus | None]] = {}

    def candidate(self, body: dict[str, Any]) -> _Candidate | str:
        """The service with its spec and `status.autoscaling` parsed; what is wrong when either
        does not parse."""
        metadata = body["metadata"]
        uid = str(metadata.get("uid", ""))
        spec_body = body.get("spec", {})
        current_body = (body.get("status") or {}).get("autoscaling")
        try:
            spec = self._spec(uid, spec_body)
            current = self._status(uid, current_body)
        except ValidationError as error:
            message = error.errors()[0]["msg"]
            return f"skipping {metadata['namespace']}/{metadata['name']}: {message}"
        return _Candidate(body, spec, current)

    def _spec(self, uid: str, found: Any) -> InferenceServiceSpec:
        kept = self._specs.get(uid)
        if kept is not None and kept[0] == found:
            return kept[1]
        self._specs.pop(uid, None)
        spec = InferenceServiceSpec.model_validate(found)
        self._specs[uid] = (copy.deepcopy(found), spec)
        return spec

    def _status(self, uid: str, found: Any) -> AutoscalingStatus | None:
        kept = self._statuses.get(uid)
        if kept is not None and kept[0] == found:
            return kept[1]
        self._statuses.pop(uid, None)
        current = AutoscalingStatus.model_validate(found) if found else None
        self._statuses[uid] = (copy.deepcopy(found), current)
        return current

    def keep_only(self, uids: set[str]) -> None:
        """Forget the services not in `uids` (deleted, or no longer autoscaled)."""
        for kept in (self._specs, self._statuses):
            for uid in kept.keys() - uids:
                del kept[uid]


def _patch(status: AutoscalingStatus, current: AutoscalingStatus | None) -> dict[str, Any]:
    """The merge patch that makes `current` into `status`: a null removes what the decision no
    longer has (a pool gone from the spec, the floor's memory of a pool whose minReplicas was
    set since)."""
    wire: dict[str, Any] = status.to_wire()
    gone = set(current.pools) - set(status.pools) if current else set()
    wire["pools"] = {**wire.get("pools", {}), **dict.fromkeys(gone)}
    for pool, decided in status.pools.items():
        kept = current.pools.get(pool) if current else None
        if decided.floor_memory is None and kept is not None and kept.floor_memory:
            wire["pools"][pool]["floorMemory"] = None
        if decided.ttft_misses is None and kept is not None and kept.ttft_misses:
            wire["pools"][pool]["ttftMisses"] = None
    if status.metrics_missing_since is None and current and current.metrics_missing_since:
        wire |= {"metricsMissingSince": None, "metricsMissingPools": None}
    return wire


def _with_gauges(
    full: Mapping[str, PoolSignals], gauges: Mapping[str, PoolSignals]
) -> dict[str, PoolSignals]:
    """The full pass's signals with the fresh gauges; a pool without fresh gauges is absent (the
    fast pass then holds it). The sample time stays the full pass's, so the policy neither
    learns from nor forecasts on a fast read."""
    return {
        pool: replace(
            signals,
            running=gauges[pool].running,
            waiting=gauges[pool].waiting,
            kv_cache_usage=gauges[pool].kv_cache_usage,
        )
        for pool, signals in full.items()
        if pool in gauges
    }
