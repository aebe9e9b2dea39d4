"""The canary split: which revision serves a session, what discovery reads of a rollout, and
real requests through the gateway to a stable and a canary stand-in."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from llmfleet.crds import labels as L
from llmfleet.gateway.discovery import Pool, Service, Split, StaticDiscovery, for_session
from llmfleet.gateway.from_objects import changes, snapshot
from tests.gateway.servers import ThreadServer, gateway
from tests.gateway.standin import StandIn
from tests.gateway.test_kube_discovery import UNIFIED, endpoint_slice, service

MODEL = "llama"
CANARY = "c0ffee1234"


def _service(stable: tuple[str, ...], canary: tuple[str, ...], weight: int) -> Service:
    base = Service(MODEL, "ns", "llama", {"unified": Pool("unified", stable)}, revision="abc")
    canary_service = Service(
        MODEL, "ns", "llama", {"unified": Pool("unified", canary)}, revision=CANARY
    )
    return Service(
        MODEL, "ns", "llama", base.pools, revision="abc", canary=Split.of(canary_service, weight)
    )


def _sessions(count: int) -> list[str]:
    return [f"s:{uuid.UUID(int=index)}" for index in range(count)]


@pytest.mark.parametrize("weight", [1, 10, 25, 50, 90])
def test_the_canary_gets_its_weight_of_sessions(weight: int) -> None:
    split = _service(("http://s",), ("http://c",), weight).canary
    assert split is not None
    share = sum(split.takes(session) for session in _sessions(20_000)) / 20_000
    assert abs(share - weight / 100) < 0.01


def test_a_session_keeps_its_side_and_a_rising_weight_only_adds_sessions() -> None:
    sessions = _sessions(5_000)
    by_weight = {}
    for weight in (0, 10, 25, 50, 100):
        split = _service(("http://s",), ("http://c",), weight).canary
        assert split is not None
        by_weight[weight] = {s for s in sessions if split.takes(s)}
        assert by_weight[weight] == {s for s in sessions if split.takes(s)}  # the same again
    assert by_weight[0] == set()
    assert by_weight[100] == set(sessions)
    assert by_weight[10] <= by_weight[25] <= by_weight[50]


def test_another_rollout_draws_other_sessions() -> None:
    sessions = _sessions(5_000)
    first = _service(("http://s",), ("http://c",), 20).canary
    other = Split.of(Service(MODEL, "ns", "llama", {}, revision="0123456789"), 20)
    assert first is not None
    overlap = {s for s in sessions if first.takes(s)} & {s for s in sessions if other.takes(s)}
    assert 0.02 < len(overlap) / len(sessions) < 0.06  # independent draws: about 20% x 20%


@pytest.mark.parametrize(
    ("stable", "canary", "weight", "served"),
    [
        pytest.param(("http://s",), ("http://c",), 100, CANARY, id="weight-100-canary"),
        pytest.param(("http://s",), ("http://c",), 0, "abc", id="weight-0-stable"),
        pytest.param(("http://s",), (), 100, "abc", id="canary-without-endpoints-gives-way"),
        pytest.param((), ("http://c",), 0, "abc", id="weight-0-never-canary"),
        pytest.param((), (), 100, CANARY, id="neither-serves-the-chosen-side-answers"),
    ],
)
def test_for_session(stable: tuple[str, ...], canary: tuple[str, ...], weight: int,
                     served: str) -> None:  # fmt: skip
    assert for_session(_service(stable, canary, weight), "s:1").revision == served


def test_a_stable_session_goes_to_the_canary_when_the_stable_side_has_no_endpoint() -> None:
    service = _service((), ("http://c",), 1)
    stable_sessions = [
        s for s in _sessions(200) if not service.canary or not service.canary.takes(s)
    ]
    assert {for_session(service, s).revision for s in stable_sessions} == {CANARY}


def _status(phase: str, weight: int = 25, revision: str = CANARY) -> dict[str, Any]:
    return {"revision": "abc", "canary": {"phase": phase, "weight": weight, "revision": revision}}


CANARY_SLICE = endpoint_slice(L.revision_child_name("llama", "unified", CANARY),
                              ("10.0.0.9", True, False))  # fmt: skip
STABLE_SLICE = endpoint_slice("llama-unified", ("10.0.0.1", True, False))


@pytest.mark.parametrize(
    ("status", "weight", "endpoints"),
    [
        pytest.param({"revision": "abc"}, None, None, id="no-canary"),
        pytest.param(_status("Progressing"), 25, ("http://10.0.0.9:8000",), id="progressing"),
        pytest.param(_status("Paused", 10), 10, ("http://10.0.0.9:8000",),
                     id="paused-keeps-its-weight"),
        pytest.param(_status("Promoting", 50), 50, ("http://10.0.0.9:8000",), id="promoting"),
        pytest.param(_status("RolledBack", 0), None, None, id="rolled-back"),
        pytest.param(_status("Promoted", 0), None, None, id="promoted"),
        pytest.param(_status("Progressing", revision="fffffffff0"), 25, (),
                     id="another-revision-has-no-endpoints-yet"),
    ],
)  # fmt: skip
def test_discovery_reads_the_rollout_from_the_status(
    status: dict[str, Any], weight: int | None, endpoints: tuple[str, ...] | None
) -> None:
    obj = service("llama", UNIFIED) | {"status": status}
    found = snapshot([obj], [STABLE_SLICE, CANARY_SLICE])["llama"]
    assert found.revision == "abc"
    assert found.pools["unified"].endpoints == ("http://10.0.0.1:8000",)
    if weight is None:
        assert found.canary is None
        return
    assert found.canary is not None
    assert found.canary.weight == weight
    assert found.canary.service.revision == status["canary"]["revision"]
    assert found.canary.service.pools["unified"].endpoints == endpoints


def test_a_disaggregated_canary_has_both_pools() -> None:
    pd = {"model": {"name": "big"}, "topology": {
        "mode": "Disaggregated", "prefill": {"replicas": 1}, "decode": {"replicas": 1},
        "kvTransfer": {"connector": "NixlConnector"}}}  # fmt: skip
    slices = [
        endpoint_slice(L.revision_child_name("big", "prefill", CANARY), ("10.0.1.1", True, False)),
        endpoint_slice(L.revision_child_name("big", "decode", CANARY), ("10.0.1.2", True, False)),
    ]
    found = snapshot([service("big", pd) | {"status": _status("Progressing")}], slices)["big"]
    assert found.canary is not None
    pools = found.canary.service.pools
    assert (pools["prefill"].endpoints, pools["decode"].endpoints) == (
        ("http://10.0.1.1:8000",), ("http://10.0.1.2:8000",))  # fmt: skip


def test_changes_say_when_a_canary_starts_moves_and_ends() -> None:
    obj = service("llama", UNIFIED)
    none = snapshot([obj | {"status": {"revision": "abc"}}], [STABLE_SLICE, CANARY_SLICE])
    at10 = snapshot([obj | {"status": _status("Progressing", 10)}], [STABLE_SLICE, CANARY_SLICE])
    at50 = snapshot([obj | {"status": _status("Progressing", 50)}], [STABLE_SLICE, CANARY_SLICE])
    started = changes(none, at10)
    assert any(f"canary {CANARY}: weight 10%" in line for line in started)
    assert any("canary" in line and "10.0.0.9" in line for line in started)
    assert changes(at10, at50) == [f"model 'llama' (ns/llama) canary {CANARY}: weight 50% "
                                   "(stable 50%)"]  # fmt: skip
    assert changes(at50, none) == [f"model 'llama' (ns/llama): canary {CANARY} ended"]
    assert changes(at50, at50) == []


def test_requests_split_by_weight_sticky_per_session_with_the_revision_said() -> None:
    """200 sessions through a real gateway: the canary's share of them is the weight (within a
    few percent), a session's second request goes where its first went, and the revision is
    in the response header and in the per-pool metric labels."""
    stable, canary = StandIn("stable"), StandIn("canary")
    with ThreadServer(stable.app()) as s, ThreadServer(canary.app()) as c:
        discovery = StaticDiscovery({MODEL: _service((s.url,), (c.url,), 25)})
        with gateway(discovery) as server, httpx.Client(base_url=server.url) as client:
            served: dict[str, list[str]] = {}
            for session in _sessions(200):
                for _ in range(2):
                    answer = client.post(
                        "/v1/chat/completions",
                        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
                        headers={"x-session-id": session.removeprefix("s:")},
                    )
                    assert answer.status_code == 200
                    served.setdefault(session, []).append(answer.headers["x-llmfleet-revision"])
            metrics = client.get("/metrics").text
    assert all(len(set(revisions)) == 1 for revisions in served.values())
    share = sum(revisions[0] == CANARY for revisions in served.values()) / len(served)
    assert abs(share - 0.25) < 0.06
    assert len(canary.received) == 2 * sum(r[0] == CANARY for r in served.values())
    assert len(stable.received) + len(canary.received) == 400
    for revision in ("abc", CANARY):
        assert f'outcome="ok",pool="unified",revision="{revision}"' in metrics
