"""Each service's spec and `status.autoscaling` parsed once while unchanged (`loop.Parsed`,
issue 28): what a pass reuses, and what makes it parse again."""

from __future__ import annotations

import copy
from typing import Any

from llmfleet.autoscaler.loop import Parsed, _Candidate
from tests.autoscaler.builders import spec

STATUS = {"pools": {"unified": {"active": 2, "spares": 0, "reason": "r"}}}


def body(**status: Any) -> dict[str, Any]:
    found: dict[str, Any] = {
        "metadata": {"namespace": "ns", "name": "svc", "uid": "u1"},
        "spec": spec().to_wire(),
    }
    if status:
        found["status"] = {"autoscaling": status}
    return found


def parsed(kept: Parsed, service: dict[str, Any]) -> _Candidate:
    candidate = kept.candidate(service)
    assert isinstance(candidate, _Candidate), candidate
    return candidate


def test_an_unchanged_service_is_not_parsed_again() -> None:
    kept, service = Parsed(), body(**STATUS)
    first = parsed(kept, service)
    again = parsed(kept, copy.deepcopy(service))  # equal JSON, as a new watch event brings it
    assert again.spec is first.spec
    assert again.current is first.current


def test_a_changed_spec_or_status_is_parsed_again_each_alone() -> None:
    kept, service = Parsed(), body(**STATUS)
    first = parsed(kept, service)
    service["status"]["autoscaling"]["pools"]["unified"]["active"] = 3  # changed in place
    written = parsed(kept, service)
    assert written.current is not None
    assert written.current.pools["unified"].active == 3
    assert written.spec is first.spec
    service["spec"]["topology"]["unified"]["maxReplicas"] = 5  # changed in place too
    edited = parsed(kept, service)
    assert edited.spec.topology.unified is not None
    assert edited.spec.topology.unified.max_replicas == 5
    assert edited.current is written.current


def test_a_spec_that_does_not_parse_is_refused_on_every_pass_until_fixed() -> None:
    kept, service = Parsed(), body()
    good = service["spec"]["topology"]["unified"]["replicas"]
    service["spec"]["topology"]["unified"]["replicas"] = "many"
    for _ in range(2):
        assert isinstance(kept.candidate(service), str)
    service["spec"]["topology"]["unified"]["replicas"] = good
    assert parsed(kept, service).spec == spec()


def test_a_forgotten_service_is_parsed_afresh() -> None:
    kept, service = Parsed(), body()
    first = parsed(kept, service)
    kept.keep_only(set())
    assert parsed(kept, service).spec is not first.spec
