"""Table tests for each routing plugin and for the pipeline that combines them."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from llmfleet.gateway.routing import prefix_affinity
from llmfleet.gateway.routing.base import Candidate, RoutingRequest
from llmfleet.gateway.routing.healthy import HealthyFilter
from llmfleet.gateway.routing.inflight_tokens import InFlightTokensScorer
from llmfleet.gateway.routing.kv_cache import KvCacheScorer
from llmfleet.gateway.routing.least_loaded import LeastLoadedScorer
from llmfleet.gateway.routing.pickers import MaxScorePicker, RoundRobinPicker
from llmfleet.gateway.routing.prefix_affinity import PrefixAffinityScorer, stable_hash
from llmfleet.gateway.routing.queue_depth import QueueDepthScorer
from llmfleet.gateway.routing.registry import Scheduler, UnknownPluginError
from llmfleet.gateway.settings import DEFAULT_PROFILES

REQUEST = RoutingRequest("m", prefix_key=None, tokens=10)


def _c(url: str, **fields: float) -> Candidate:
    return Candidate(url, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("candidates", "expected"),
    [
        pytest.param([_c("a"), _c("b")], [1.0, 1.0], id="all-idle"),
        pytest.param([_c("a", waiting=4), _c("b", waiting=1)], [0.0, 0.75], id="engine-queues"),
        pytest.param(
            [_c("a", in_flight=3, running=1), _c("b")], [0.0, 1.0], id="sent-but-not-yet-running"
        ),
        pytest.param([_c("a", in_flight=2, running=5)], [1.0], id="running-beyond-in-flight"),
    ],
)
def test_queue_depth(candidates: list[Candidate], expected: list[float]) -> None:
    assert QueueDepthScorer().score(REQUEST, candidates) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        pytest.param([0.0, 0.5, 1.0], [1.0, 0.5, 0.0], id="linear"),
        pytest.param([0.9, 0.95], [0.1, 0.05], id="absolute-not-relative"),
    ],
)
def test_kv_cache(usage: list[float], expected: list[float]) -> None:
    candidates = [_c(str(i), kv_usage=u) for i, u in enumerate(usage)]
    assert KvCacheScorer().score(REQUEST, candidates) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [
        pytest.param([0, 0], [1.0, 1.0], id="none-in-flight"),
        pytest.param([1000, 250, 0], [0.0, 0.75, 1.0], id="relative-to-the-busiest"),
    ],
)
def test_inflight_tokens(tokens: list[int], expected: list[float]) -> None:
    candidates = [_c(str(i), in_flight_tokens=t) for i, t in enumerate(tokens)]
    assert InFlightTokensScorer().score(REQUEST, candidates) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("candidates", "expected"),
    [
        pytest.param([_c("a", in_flight=4), _c("b", in_flight=2)], [0.0, 0.5], id="own-counts"),
        pytest.param(
            [_c("a", in_flight=1, running=4, waiting=4), _c("b", in_flight=2)],
            [0.0, 0.75],
            id="engine-counts-other-gateways",
        ),
    ],
)
def test_least_loaded(candidates: list[Candidate], expected: list[float]) -> None:
    assert LeastLoadedScorer().score(REQUEST, candidates) == pytest.approx(expected)


def test_healthy_filter_drops_ejected() -> None:
    kept = HealthyFilter().filter(REQUEST, [_c("a", ejected=True), _c("b")])  # type: ignore[arg-type]
    assert [c.url for c in kept] == ["b"]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        pytest.param([{"stale": True}, {}], ["b"], id="a-stale-endpoint-is-not-preferred"),
        pytest.param([{"stale": True}, {"stale": True}], ["a", "b"], id="all-stale-all-kept"),
        pytest.param([{"stale": True}, {"ejected": True}], ["a"], id="stale-beats-ejected"),
    ],
)
def test_healthy_filter_prefers_fresh_figures(
    flags: list[dict[str, bool]], expected: list[str]
) -> None:
    candidates = [_c(url, **flag) for url, flag in zip("ab", flags, strict=True)]
    assert [c.url for c in HealthyFilter().filter(REQUEST, candidates)] == expected


URLS = [f"http://10.0.0.{i}:8000" for i in range(4)]


def _owner(key: int, loads: dict[str, int], factor: float = 1.25) -> str | None:
    scorer = PrefixAffinityScorer(factor)
    candidates = [_c(url, in_flight=load) for url, load in loads.items()]
    return scorer.owner(RoutingRequest("m", key, 1), candidates)


def test_prefix_affinity_same_key_same_owner_and_spread_over_keys() -> None:
    idle = dict.fromkeys(URLS, 0)
    owners = [_owner(stable_hash(str(k).encode()), idle) for k in range(400)]
    assert owners == [_owner(stable_hash(str(k).encode()), idle) for k in range(400)]
    spread = Counter(owners)
    assert set(spread) == set(URLS)
    assert min(spread.values()) > 400 / 4 / 2  # no endpoint gets less than half its share


def test_prefix_affinity_moves_few_keys_when_an_endpoint_leaves() -> None:
    keys = [stable_hash(str(k).encode()) for k in range(400)]
    before = {k: _owner(k, dict.fromkeys(URLS, 0)) for k in keys}
    after = {k: _owner(k, dict.fromkeys(URLS[:3], 0)) for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert all(before[k] == URLS[3] for k in moved)  # only the leaver's keys move


def _reference_owner(key: int, urls: list[str]) -> str:
    """The ring's definition, spelled out (module docstring): the first point clockwise."""
    points = sorted((stable_hash(f"{url}#{v}".encode()), url) for url in urls for v in range(64))
    return next((url for point, url in points if point >= key), points[0][1])


def test_prefix_affinity_owner_is_the_first_point_clockwise() -> None:
    urls = [f"http://10.0.1.{i}:8000" for i in (3, 11, 7, 250, 42)]
    for k in range(300):
        key = stable_hash(f"k{k}".encode())
        assert _owner(key, dict.fromkeys(urls, 0), factor=100.0) == _reference_owner(key, urls)


def test_prefix_affinity_keeps_a_ring_per_pool_of_a_fleet() -> None:
    """Traffic over 1,000 pools builds each pool's ring once, not once per request (with 256
    rings kept, nearly every request rebuilt its pool's 640 points)."""
    pools = [[f"http://10.1.{i // 200}.{i % 200}:{8000 + k}" for k in range(10)]
             for i in range(1000)]  # fmt: skip
    built = prefix_affinity._ring.cache_info().misses
    for _ in range(2):
        for pool in pools:
            _owner(stable_hash(pool[0].encode()), dict.fromkeys(pool, 0))
    assert prefix_affinity._ring.cache_info().misses - built == len(pools)


@pytest.mark.parametrize(
    ("owner_load", "others_load", "factor", "stays"),
    [
        pytest.param(0, 0, 1.25, True, id="idle-pool"),
        pytest.param(5, 4, 1.25, True, id="within-the-bound"),
        pytest.param(8, 1, 1.25, False, id="hot-prefix-spills"),
        pytest.param(8, 1, 4.0, True, id="loose-bound-keeps-it"),
    ],
)
def test_prefix_affinity_bounded_load(
    owner_load: int, others_load: int, factor: float, stays: bool
) -> None:
    key = stable_hash(b"system prompt")
    home = _owner(key, dict.fromkeys(URLS, 0))
    assert home is not None
    loads = {url: owner_load if url == home else others_load for url in URLS}
    spill = _owner(key, loads, factor)
    assert (spill == home) is stays
    if not stays:  # the overflow always lands on the same next endpoint of the ring
        assert spill == _owner(key, loads, factor)


def test_prefix_affinity_without_key_scores_nothing() -> None:
    scores = PrefixAffinityScorer().score(REQUEST, [_c("a"), _c("b")])
    assert scores == [0.0, 0.0]


def test_max_score_picker_breaks_ties_by_in_flight() -> None:
    picker = MaxScorePicker(random.Random(1))
    candidates = [_c("a", in_flight=3), _c("b", in_flight=1), _c("c")]
    assert picker.pick(candidates, [1.0, 1.0, 0.5]).url == "b"


def test_round_robin_picker_cycles() -> None:
    picker = RoundRobinPicker()
    candidates = [_c("a"), _c("b"), _c("c")]
    assert [picker.pick(candidates, [0, 0, 0]).url for _ in range(4)] == ["a", "b", "c", "a"]


def _scheduler(profile: str) -> Scheduler:
    p = DEFAULT_PROFILES[profile]
    return Scheduler.build(p.filters, p.scorers, p.picker)


@pytest.mark.parametrize(
    ("profile", "candidates", "expected"),
    [
        pytest.param(
            "least-loaded", [_c("a", in_flight=2), _c("b"), _c("c", in_flight=1)], "b", id="ll"
        ),
        pytest.param(
            "prefix-load",
            [_c("a", kv_usage=0.9, waiting=3), _c("b", kv_usage=0.1)],
            "b",
            id="load-decides-without-prefix",
        ),
        pytest.param(
            "prefix-load",
            [_c("a", ejected=True), _c("b", ejected=True, in_flight=1)],
            "a",
            id="all-ejected-still-routes",
        ),
    ],
)
def test_profiles(profile: str, candidates: list[Candidate], expected: str) -> None:
    assert _scheduler(profile).pick(REQUEST, candidates) == next(
        c for c in candidates if c.url == expected
    )


def test_prefix_load_keeps_a_prefix_on_its_owner_until_it_is_busier() -> None:
    scheduler = _scheduler("prefix-load")
    request = RoutingRequest("m", stable_hash(b"shared system prompt"), 100)
    idle = [_c(url) for url in URLS]
    home = scheduler.pick(request, idle)
    assert home is not None
    assert {scheduler.pick(request, idle) for _ in range(20)} == {home}
    queued = [_c(c.url, waiting=8, in_flight=8) if c == home else c for c in idle]
    assert scheduler.pick(request, queued) != home


def test_scores_are_clamped() -> None:
    class Wild:
        def score(self, request: RoutingRequest, candidates: object) -> list[float]:
            return [5.0, -3.0]

    scheduler = Scheduler([], [(Wild(), 1.0), (KvCacheScorer(), 1.0)], MaxScorePicker())
    # unclamped, a would win by 5; clamped it is 1 + 0 vs 0 + 1: tie goes to fewer in flight
    pick = scheduler.pick(REQUEST, [_c("a", kv_usage=1.0, in_flight=1), _c("b")])
    assert pick is not None
    assert pick.url == "b"


def test_unknown_plugin_names_the_known_ones() -> None:
    with pytest.raises(UnknownPluginError, match=r"unknown scorer 'prefix' \(known: .*queue-depth"):
        Scheduler.build(["healthy"], {"prefix": 1.0}, "max-score")


def test_no_candidates_picks_nothing() -> None:
    assert _scheduler("round-robin").pick(REQUEST, []) is None


def test_prefix_affinity_counts_the_engines_own_queue() -> None:
    key = stable_hash(b"system prompt")
    home = _owner(key, dict.fromkeys(URLS, 0))
    candidates = [
        _c(url, waiting=50, running=5) if url == home else _c(url) for url in URLS
    ]  # busy with another gateway's traffic: nothing in flight from this one
    assert PrefixAffinityScorer().owner(RoutingRequest("m", key, 1), candidates) != home
