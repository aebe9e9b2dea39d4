"""The priority stage's pure rules (`policies/saturation`) and the class a request gets
(`app._priority`: its tenant's, or lower by the `x-llmfleet-priority` header)."""

from __future__ import annotations

import pytest

from llmfleet.gateway.app import _priority
from llmfleet.gateway.endpoints import EngineLoad
from llmfleet.gateway.policies.saturation import (
    PoolLoad,
    Shares,
    Verdict,
    admit,
    pool_load,
    saturation,
)
from llmfleet.gateway.proxy import Priority


def load(waiting: float, kv: float = 0.0) -> EngineLoad:
    return EngineLoad(waiting=waiting, running=1.0, kv_usage=kv)


@pytest.mark.parametrize(
    ("figures", "expected"),
    [
        pytest.param([], None, id="no-endpoints"),
        pytest.param([None, None], None, id="all-stale-or-missing"),
        pytest.param([load(6, 0.5)], PoolLoad(1, 6, 0.5), id="one"),
        pytest.param([load(6, 0.5), load(2, 0.9)], PoolLoad(2, 4, 0.7), id="mean"),
        pytest.param([load(6, 0.5), None], PoolLoad(1, 6, 0.5), id="stale-left-out"),
    ],
)
def test_pool_load_is_the_mean_of_fresh_figures(
    figures: list[EngineLoad | None], expected: PoolLoad | None
) -> None:
    assert pool_load(figures) == expected


@pytest.mark.parametrize(
    ("pool", "saturated"),
    [
        pytest.param(None, None, id="unknown-is-not-saturated"),
        pytest.param(PoolLoad(2, 0, 0), None, id="idle"),
        pytest.param(PoolLoad(2, 4, 0.85), None, id="at-both-thresholds"),
        pytest.param(
            PoolLoad(2, 4.5, 0), "mean waiting requests 4.5 > maxQueueDepth 4", id="queue"
        ),
        pytest.param(PoolLoad(1, 0, 0.9), "mean KV-cache usage 0.9 > 0.85", id="kv-cache"),
    ],
)
def test_saturation(pool: PoolLoad | None, saturated: str | None) -> None:
    assert saturation(pool, max_queue_depth=4, max_kv_usage=0.85) == saturated


SHARES = Shares(sheddable=0.7, standard=0.9)
SATURATED = "mean waiting requests 9 > maxQueueDepth 4"


@pytest.mark.parametrize(
    ("priority", "in_flight", "saturated", "action"),
    [
        pytest.param("critical", 99, SATURATED, "admit", id="critical-always"),
        pytest.param("standard", 8, None, "admit", id="standard-below-share"),
        pytest.param("standard", 9, None, "refuse", id="standard-at-share"),
        pytest.param("standard", 10, None, "admit", id="full-is-the-forwarders-to-refuse"),
        pytest.param("standard", 0, SATURATED, "admit", id="standard-never-degraded"),
        pytest.param("sheddable", 6, None, "admit", id="sheddable-below-share"),
        pytest.param("sheddable", 7, None, "offload", id="sheddable-at-share"),
        pytest.param("sheddable", 0, SATURATED, "offload", id="sheddable-saturated"),
        pytest.param("sheddable", 10, None, "offload", id="sheddable-full-still-offloaded"),
    ],
)
def test_admission_by_class(
    priority: Priority, in_flight: int, saturated: str | None, action: str
) -> None:
    assert admit(priority, in_flight, 10, SHARES, saturated).action == action


def test_a_verdict_says_why() -> None:
    assert admit("standard", 9, 10, SHARES, None) == Verdict(
        "refuse", "9 in flight, standard share 0.9 of 10 is 9"
    )
    assert admit("sheddable", 0, 10, SHARES, SATURATED).reason == f"pool saturated: {SATURATED}"


def test_shares_round_down_but_admit_one() -> None:
    # 0.7 x 3 = 2.1: two sheddable requests fit; 0.29 x 3 < 1: one still does (an idle pool
    # admits anything), and with one slot nothing can be reserved.
    assert admit("sheddable", 1, 3, SHARES, None).action == "admit"
    assert admit("sheddable", 2, 3, SHARES, None).action == "offload"
    assert admit("sheddable", 0, 3, Shares(0.29, 0.29), None).action == "admit"
    assert admit("sheddable", 1, 3, Shares(0.29, 0.29), None).action == "offload"
    assert admit("standard", 0, 1, Shares(0.29, 0.29), None).action == "admit"
    assert admit("standard", 1, 3, Shares(0.29, 0.29), None).action == "refuse"


@pytest.mark.parametrize(
    ("ceiling", "header", "expected"),
    [
        pytest.param(None, None, "standard", id="no-tenants-no-header"),
        pytest.param(None, "critical", "critical", id="no-tenants-header-as-is"),
        pytest.param(None, "Sheddable ", "sheddable", id="no-tenants-case-and-space"),
        pytest.param(None, "urgent", "standard", id="no-tenants-unknown-header"),
        pytest.param("critical", None, "critical", id="tenant-class"),
        pytest.param("critical", "sheddable", "sheddable", id="tenant-lowers"),
        pytest.param("standard", "critical", "standard", id="tenant-cannot-raise"),
        pytest.param("sheddable", "critical", "sheddable", id="sheddable-cannot-raise"),
        pytest.param("sheddable", "standard", "sheddable", id="sheddable-stays"),
        pytest.param("standard", "bogus", "standard", id="tenant-unknown-header"),
    ],
)
def test_priority_of_a_request(
    ceiling: Priority | None, header: str | None, expected: Priority
) -> None:
    headers = {} if header is None else {"x-llmfleet-priority": header}
    assert _priority(ceiling, headers) == expected
