"""Two autoscaler electors on one Lease of the real API server (issue 27): one leads, the other
follows until the leader stops renewing or gives the Lease up. Times are passed in (the API
server stores them and never judges them), so nothing waits for a Lease to run out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from kubernetes.client.exceptions import ApiException

from llmfleet.autoscaler.lease import LeaseElector
from tests.cluster.kube import Kube

pytestmark = pytest.mark.cluster

T0 = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_one_of_two_leads_and_the_other_takes_over(kube: Kube, namespace: str) -> None:
    api = kube.api()
    a = LeaseElector(api, namespace, "llmfleet-autoscaler", "a", 60)
    b = LeaseElector(api, namespace, "llmfleet-autoscaler", "b", 60)
    assert a.lead(at(0)) is True  # creates it
    assert b.lead(at(1)) is False
    assert a.lead(at(30)) is True  # renews
    assert b.lead(at(80)) is False  # renewed at 30: valid until 90
    assert b.lead(at(91)) is True  # a stopped renewing
    assert a.lead(at(92)) is False
    lease = kube.get("lease", "llmfleet-autoscaler", "-n", namespace)
    assert lease["spec"]["holderIdentity"] == "b"
    assert lease["spec"]["leaseTransitions"] == 1
    b.release()  # b shuts down: a takes over at once, not a minute later
    assert a.lead(at(93)) is True
    assert b.lead(at(94)) is False


def test_a_stale_write_loses(kube: Kube, namespace: str) -> None:
    """Both see an expired Lease; the API server takes one write (its resourceVersion) and
    refuses the other, which stays a follower."""
    api = kube.api()
    a = LeaseElector(api, namespace, "lease", "a", 60)
    assert a.lead(at(0)) is True
    b = LeaseElector(api, namespace, "lease", "b", 60)
    c = LeaseElector(api, namespace, "lease", "c", 60)
    seen = b.leases.read_namespaced_lease("lease", namespace)
    assert c.lead(at(100)) is True  # c takes over first
    # b writes with the version it read before c's write: refused.
    seen.spec.holder_identity = "b"
    with pytest.raises(ApiException) as refused:
        b.leases.replace_namespaced_lease("lease", namespace, seen)
    assert refused.value.status == 409
    assert b.lead(at(101)) is False
    assert kube.get("lease", "lease", "-n", namespace)["spec"]["holderIdentity"] == "c"
