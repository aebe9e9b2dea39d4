"""Children the API server refused, and when to try each again (pure: no I/O, time passed in).

A refusal is reported in the status at once (`conditions.py`) and tried again with exponential
back-off per child, so a child the API server will never take costs one write and one log line
per back-off step, not one per pass. A changed manifest (the spec was edited) is tried at once.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ChildKey = tuple[str, str, str, str]
"""(apiVersion, kind, namespace, name) of a child."""


def child_key(manifest: Mapping[str, Any]) -> ChildKey:
    metadata = manifest["metadata"]
    return (manifest["apiVersion"], manifest["kind"], metadata.get("namespace") or "",
            metadata["name"])  # fmt: skip


def digest(manifest: Mapping[str, Any]) -> str:
    """Identifies a manifest's content (key order does not matter)."""
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()


INVALID = 422
"""The API server's answer to an object it finds invalid (`reason: Invalid`)."""


@dataclass(frozen=True)
class ChildFailure:
    """A write of one child that the API server refused."""

    kind: str
    name: str
    code: int
    """HTTP status: 422 invalid, 403 forbidden (RBAC, quota, an admission policy), …"""
    reason: str
    """The API server's reason word (`Invalid`, `Forbidden`, …)."""
    message: str
    """The API server's own message."""
    action: str = "apply"
    """`apply`, or `delete` for a child being pruned."""

    @property
    def invalid(self) -> bool:
        return self.code == INVALID

    def describe(self) -> str:
        verb = "" if self.action == "apply" else f"{self.action} of "
        return f"{verb}{self.kind} {self.name} ({self.code} {self.reason}): {self.message}"


def retry_delay(failures: int, first: float, cap: float) -> float:
    """Seconds to wait after `failures` (≥ 1) failures in a row: first, 2 first, 4 first, … cap."""
    return min(first * 2.0 ** min(failures - 1, 64), cap)


def requeue_delay(
    failures: int, first: float, cap: float, retry_after: float | None = None
) -> float:
    """Seconds before a failed pass runs again: its back-off (`retry_delay`), or longer when
    the API server asked for longer (Retry-After, `answers.Transient`); a server's ask is honoured
    past `cap`."""
    return max(retry_delay(failures, first, cap), retry_after or 0.0)


@dataclass(frozen=True)
class _Refused:
    digest: str
    failures: int
    retry_at: float
    failure: ChildFailure


class Backoff:
    """Per service, the children whose last write was refused: the manifest refused, how many
    times in a row, when it may be tried again, and the failure (reported meanwhile).

    Times are seconds on any clock that only moves forward; the caller passes `now`."""

    def __init__(self, first: float, cap: float) -> None:
        self.first = first
        self.cap = cap
        self._refused: dict[tuple[str, str], dict[ChildKey, _Refused]] = {}

    def waiting(
        self, service: tuple[str, str], key: ChildKey, manifest_digest: str, now: float
    ) -> ChildFailure | None:
        """The failure still standing for this exact manifest while its back-off lasts; None
        when it may be written now (never refused, back-off over, or the manifest changed)."""
        refused = self._refused.get(service, {}).get(key)
        if refused is None or refused.digest != manifest_digest or now >= refused.retry_at:
            return None
        return refused.failure

    def failed(
        self,
        service: tuple[str, str],
        key: ChildKey,
        manifest_digest: str,
        failure: ChildFailure,
        now: float,
    ) -> float:
        """Record a refusal; returns the seconds until the child may be tried again."""
        children = self._refused.setdefault(service, {})
        before = children.get(key)
        failures = before.failures + 1 if before and before.digest == manifest_digest else 1
        delay = retry_delay(failures, self.first, self.cap)
        children[key] = _Refused(manifest_digest, failures, now + delay, failure)
        return delay

    def succeeded(self, service: tuple[str, str], key: ChildKey) -> None:
        children = self._refused.get(service)
        if children is not None:
            children.pop(key, None)
            if not children:
                del self._refused[service]

    def next_try(self, service: tuple[str, str], now: float) -> float | None:
        """Seconds until the earliest refused child of the service may be tried again (None
        when no back-off is running)."""
        waits = [r.retry_at - now for r in self._refused.get(service, {}).values()]
        return min((wait for wait in waits if wait > 0), default=None)

    def keep(self, service: tuple[str, str], keys: set[ChildKey]) -> None:
        """Forget refusals of children the service no longer has (the spec changed)."""
        children = self._refused.get(service, {})
        for key in set(children) - keys:
            del children[key]
        if not children:
            self._refused.pop(service, None)

    def forget(self, service: tuple[str, str]) -> None:
        """The service is gone."""
        self._refused.pop(service, None)
