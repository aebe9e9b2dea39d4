"""Leader election over a coordination.k8s.io/v1 Lease, so that two autoscaler replicas never
both write decisions: the one holding the Lease runs its passes, the other stands by and takes
over once the holder stops renewing.

`decide` is the rule (pure); `LeaseElector` reads and writes the Lease. Every write carries the
`resourceVersion` it read, so when two replicas try at once the API server takes one and refuses
the other (409), which then stays a follower.

NOTE: a leader checks the Lease before each pass and renews it there; a pass that starts with a
valid Lease writes its decisions even if it runs past the Lease's end. A pass takes seconds and
the Lease lasts `leaseDurationSeconds` (60 by default) from the last renewal, so a follower can
only take over from a leader that has missed passes for most of a minute; decisions are
idempotent (the same inputs give the same decision), so the rare overlap costs a duplicate
write, never a wrong one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

log = logging.getLogger("llmfleet.autoscaler.lease")
HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409


class Step(StrEnum):
    CREATE = "create"
    """No Lease yet: create it, held by us."""
    RENEW = "renew"
    """We hold it: renew it."""
    TAKE_OVER = "take-over"
    """Its holder let it expire (or released it): take it."""
    FOLLOW = "follow"
    """Someone else holds it."""


@dataclass(frozen=True)
class Held:
    """What a Lease says."""

    holder: str
    renewed: datetime | None
    duration_seconds: float


def decide(lease: Held | None, me: str, now: datetime) -> Step:
    """What `me` does about the Lease as it is now."""
    if lease is None:
        return Step.CREATE
    if lease.holder == me:
        return Step.RENEW
    if not lease.holder or lease.renewed is None:
        return Step.TAKE_OVER
    if now > lease.renewed + timedelta(seconds=lease.duration_seconds):
        return Step.TAKE_OVER
    return Step.FOLLOW


def _micro_time(moment: datetime) -> str:
    """A Kubernetes MicroTime: RFC 3339 with six digits of fraction, which the API server
    requires.

    NOTE: the Kubernetes client (v37) turns the body into its model, parsing this string into
    a `datetime`, and writes that back with `isoformat()`, which leaves the fraction out when
    it is zero: the API server then refuses the Lease ("cannot parse ... as .000000"). A time
    on a whole second is therefore moved one microsecond on."""
    moment = moment.astimezone(UTC)
    if moment.microsecond == 0:
        moment += timedelta(microseconds=1)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _held(body: Any) -> Held:
    spec = body.spec
    renewed = spec.renew_time
    if renewed is not None and renewed.tzinfo is None:
        renewed = renewed.replace(tzinfo=UTC)
    return Held(spec.holder_identity or "", renewed, float(spec.lease_duration_seconds or 0))


class LeaseElector:
    """Holds the Lease `namespace/name` for `identity` while it may."""

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        name: str,
        identity: str,
        duration_seconds: float,
    ) -> None:
        self.leases = client.CoordinationV1Api(api)
        self.namespace, self.name = namespace, name
        self.identity = identity
        self.duration = duration_seconds
        self.leading = False

    def _spec(self, now: datetime, transitions: int, acquired: datetime) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.duration)),
            "acquireTime": _micro_time(acquired),
            "renewTime": _micro_time(now),
            "leaseTransitions": transitions,
        }

    def lead(self, now: datetime) -> bool:
        """Acquire or renew the Lease if this replica may; True while it leads. An API error
        counts as not leading (the next call tries again)."""
        try:
            leading = self._step(now)
        except ApiException as error:
            if error.status != HTTP_CONFLICT:
                log.warning("lease %s/%s: %s %s", self.namespace, self.name, error.reason,
                            error.body)  # fmt: skip
            leading = False
        if leading != self.leading:
            log.info(
                "%s %s the lease %s/%s",
                self.identity,
                "holds" if leading else "no longer holds",
                self.namespace,
                self.name,
            )
        self.leading = leading
        return leading

    def _step(self, now: datetime) -> bool:
        body: Any
        try:
            body = self.leases.read_namespaced_lease(self.name, self.namespace)
        except ApiException as error:
            if error.status != HTTP_NOT_FOUND:
                raise
            body = None
        step = decide(None if body is None else _held(body), self.identity, now)
        if step is Step.FOLLOW:
            return False
        if step is Step.CREATE:
            lease: Any = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(now, 0, now),
            }
            self.leases.create_namespaced_lease(self.namespace, lease)
            return True
        transitions = body.spec.lease_transitions or 0
        acquired = body.spec.acquire_time if step is Step.RENEW else now
        if step is Step.TAKE_OVER:
            transitions += 1
        spec = self._spec(now, transitions, acquired or now)
        self.leases.replace_namespaced_lease(self.name, self.namespace, self._replacing(body, spec))
        return True

    def _replacing(self, body: Any, spec: dict[str, Any]) -> Any:
        """The Lease with `spec`, replacing the version `body` was read at (a concurrent writer
        makes the replace fail with a conflict instead of being overwritten)."""
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "resourceVersion": body.metadata.resource_version,
            },
            "spec": spec,
        }

    def release(self) -> None:
        """Give the Lease up (on shutdown), so a standby takes over at its next check."""
        if not self.leading:
            return
        try:
            body: Any = self.leases.read_namespaced_lease(self.name, self.namespace)
            if body.spec.holder_identity != self.identity:
                return
            spec = body.spec
            released = {
                "holderIdentity": "",
                "leaseDurationSeconds": spec.lease_duration_seconds,
                "leaseTransitions": spec.lease_transitions or 0,
                **({"renewTime": _micro_time(spec.renew_time)} if spec.renew_time else {}),
            }
            self.leases.replace_namespaced_lease(
                self.name, self.namespace, self._replacing(body, released)
            )
        except ApiException as error:
            log.warning("lease %s/%s not released: %s", self.namespace, self.name, error.reason)
        self.leading = False
