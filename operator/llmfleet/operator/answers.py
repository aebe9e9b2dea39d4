"""What the API server answered the operator: a refusal to report, or something worth asking again
soon (`Transient`), which ends a pass without sleeping in it (`kube.py`, `handlers.py`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from kubernetes.client.exceptions import ApiException

from llmfleet.operator.failures import ChildFailure

T = TypeVar("T")
RETRYABLE = frozenset({409, 429, 500, 502, 503, 504})
"""Answers worth asking again soon: conflicts, throttling, server errors (`Transient`)."""
RETRYABLE_WRITE = RETRYABLE - {500}
"""For writes, a 500 is as likely the object's fault (the API server answers some invalid specs
with it) as the server's: the pass reports it and the child's back-off tries again later."""
RETRYABLE_DELETE = RETRYABLE_WRITE - {409}
"""A delete's 409 is its uid precondition failing: another object of that name, not a race."""


class Transient(Exception):
    """The API server answered something worth asking again soon (`RETRYABLE`): the pass ends
    here, unlike a refusal (an `ApiException`, which a pass reports), and its service's loop
    runs it again after `retry_after` (the answer's Retry-After, in seconds) or its back-off,
    whichever is longer."""

    def __init__(self, error: ApiException) -> None:
        super().__init__(f"{error.status} {error.reason}: {api_message(error)}")
        self.error = error
        self.retry_after = retry_after(error)


def retry_after(error: ApiException) -> float | None:
    """The answer's Retry-After header in seconds (the API server sends whole seconds with a
    429); None without one, or with a date or anything else."""
    headers: Mapping[str, Any] = error.headers or {}
    for header, value in headers.items():
        if str(header).lower() == "retry-after":
            try:
                return max(float(value), 0.0)
            except (TypeError, ValueError):
                return None
    return None


def asked(call: Callable[[], T], retryable: frozenset[int] = RETRYABLE) -> T:
    """One API call; a `retryable` answer raises `Transient` (nothing sleeps here), any other
    refusal its `ApiException`."""
    try:
        return call()
    except ApiException as error:
        if error.status in retryable:
            raise Transient(error) from error
        raise


def api_message(error: ApiException) -> str:
    """The API server's own message in a refusal (its Status object), else the HTTP reason."""
    try:
        status = json.loads(error.body or "")
    except (TypeError, ValueError):
        status = None
    message = status.get("message") if isinstance(status, dict) else None
    return str(message or error.reason or "no message").strip()


def refusal(manifest: Mapping[str, Any], error: ApiException, action: str) -> ChildFailure:
    """What the API server said when it refused to `action` this child."""
    try:
        status = json.loads(error.body or "")
    except (TypeError, ValueError):
        status = None
    reason = status.get("reason") if isinstance(status, dict) else None
    return ChildFailure(
        kind=manifest["kind"],
        name=manifest["metadata"]["name"],
        code=int(error.status or 0),
        reason=str(reason or error.reason or "Error"),
        message=api_message(error),
        action=action,
    )
