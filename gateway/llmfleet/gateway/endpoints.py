"""What the gateway knows about each engine: scraped load, its own in-flight counts, failures.

One `EndpointState` per base URL, shared by every pool that lists the URL. The routing plugins
never see this mutable object, only the frozen `Candidate` view `candidate()` takes of it.

Reading an endpoint's figures for a decision (`candidates`, `fresh_loads`) stamps it in `reads`:
that is what makes it *active*, and only active endpoints are scraped (`scrape_plan`). The
stamp is one dict store per candidate, on the event loop, where the figures are read anyway.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from llmfleet.gateway.routing.base import Candidate

Clock = Callable[[], float]


@dataclass
class EngineLoad:
    """Figures from one scrape of an engine's /metrics (vLLM names), summed over label sets."""

    waiting: float = 0.0
    """`vllm:num_requests_waiting`"""
    running: float = 0.0
    """`vllm:num_requests_running`"""
    kv_usage: float = 0.0
    """`vllm:kv_cache_usage_perc` (0-1; the older `vllm:gpu_cache_usage_perc` as a fallback)"""


@dataclass
class EndpointState:
    url: str
    waiting: float = 0.0
    running: float = 0.0
    kv_usage: float = 0.0
    scraped: bool = False
    """The figures above are a scrape's (False: never scraped, or forgotten since)."""
    scraped_at: float = float("-inf")
    in_flight: int = 0
    in_flight_tokens: int = 0
    consecutive_failures: int = 0
    ejected_until: float = float("-inf")

    @property
    def load(self) -> EngineLoad | None:
        """The last scrape's figures; None if there is none. Kept as numbers of this state,
        not as an `EngineLoad` per endpoint: one object fewer per engine for the garbage
        collector to walk (`gc_pauses.py`), 10,000 at 1,000 services x 10."""
        if not self.scraped:
            return None
        return EngineLoad(waiting=self.waiting, running=self.running, kv_usage=self.kv_usage)


class EndpointTable:
    """Mutable per-endpoint state; only the event loop's thread touches it (no locks needed)."""

    def __init__(
        self,
        *,
        eject_after_failures: int,
        eject_seconds: float,
        stale_seconds: float,
        clock: Clock = time.monotonic,
    ) -> None:
        self._states: dict[str, EndpointState] = {}
        self.reads: dict[str, float] = {}
        """Endpoint URL -> the last time routing read its figures (what the scraper serves);
        the scraper removes endpoints that went idle (`forget_figures`)."""
        self.arrived: list[str] = []
        """Endpoints read for the first time since they were last absent from `reads`, in
        order; the scraper takes them (`take_arrived`) into its schedule."""
        self._eject_after = eject_after_failures
        self._eject_seconds = eject_seconds
        self._stale_seconds = stale_seconds
        self.clock = clock
        self.ejections = 0
        """Count of ejections so far (the metrics layer exports the increments)."""

    def get(self, url: str) -> EndpointState:
        state = self._states.get(url)
        if state is None:
            state = self._states[url] = EndpointState(url)
        return state

    def retain(self, urls: Iterable[str]) -> None:
        """Forget endpoints that no longer exist (their counts cannot matter any more)."""
        keep = set(urls)
        for url in [url for url in self._states if url not in keep]:
            del self._states[url]
        for url in [url for url in self.reads if url not in keep]:
            del self.reads[url]

    def candidates(self, urls: Iterable[str]) -> list[Candidate]:
        """The routing view of `urls`, each stamped as read now."""
        now = self.clock()
        reads = self.reads
        found = []
        for url in urls:
            if url not in reads:
                self.arrived.append(url)
            reads[url] = now
            found.append(self.candidate(self.get(url), now))
        return found

    def fresh_loads(self, urls: Iterable[str]) -> list[EngineLoad | None]:
        """The scraped figures of `urls` where they are fresh (None: stale or never scraped),
        each stamped as read now (an admission check keeps its pool scraped too)."""
        now = self.clock()
        found: list[EngineLoad | None] = []
        for url in urls:
            if url not in self.reads:
                self.arrived.append(url)
            self.reads[url] = now
            state = self.get(url)
            fresh = now - state.scraped_at <= self._stale_seconds
            found.append(state.load if fresh else None)
        return found

    def take_arrived(self) -> list[str]:
        """The endpoints that arrived since the last call (see `arrived`)."""
        arrived, self.arrived = self.arrived, []
        return arrived

    def forget_figures(self, url: str) -> None:
        """`url` went idle: drop its read stamp and its figures, so when traffic comes back it
        reads as never scraped (zeros, not stale) until its first scrape lands."""
        self.reads.pop(url, None)
        state = self._states.get(url)
        if state is not None:
            state.scraped = False
            state.waiting = state.running = state.kv_usage = 0.0
            state.scraped_at = float("-inf")

    def candidate(self, state: EndpointState, now: float) -> Candidate:
        fresh = state.scraped and now - state.scraped_at <= self._stale_seconds
        return Candidate(
            stale=state.scraped and not fresh,
            url=state.url,
            waiting=state.waiting if fresh else 0.0,
            running=state.running if fresh else 0.0,
            kv_usage=state.kv_usage if fresh else 0.0,
            in_flight=state.in_flight,
            in_flight_tokens=state.in_flight_tokens,
            ejected=state.ejected_until > now,
        )

    def record_load(self, url: str, load: EngineLoad) -> None:
        """`load` becomes `url`'s figures (copied into its state: no object kept per scrape)."""
        state = self.get(url)
        state.waiting, state.running, state.kv_usage = load.waiting, load.running, load.kv_usage
        state.scraped = True
        state.scraped_at = self.clock()

    def begin(self, url: str, tokens: int) -> None:
        state = self.get(url)
        state.in_flight += 1
        state.in_flight_tokens += tokens

    def end(self, url: str, tokens: int) -> None:
        state = self._states.get(url)
        if state is not None:
            state.in_flight = max(0, state.in_flight - 1)
            state.in_flight_tokens = max(0, state.in_flight_tokens - tokens)

    def succeeded(self, url: str) -> None:
        state = self._states.get(url)
        if state is not None:
            state.consecutive_failures = 0

    def failed(self, url: str, *, hung: bool = False) -> bool:
        """Count a failure; True when it ejects the endpoint (for `eject_seconds`): after
        `eject_after_failures` in a row, or at once when the endpoint `hung` (timed out)."""
        state = self.get(url)
        state.consecutive_failures += 1
        if state.consecutive_failures < self._eject_after and not hung:
            return False
        state.consecutive_failures = 0
        state.ejected_until = self.clock() + self._eject_seconds
        self.ejections += 1
        return True
