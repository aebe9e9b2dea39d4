"""API requests per second by component, verb and resource, read from the API server's audit log.

The local cluster writes the log when started with `audit_log=True` (`LocalCluster.audit_log`,
JSON lines at level Metadata, rotated copies beside it). Each request is counted once, by its
`auditID` (a watch logs ResponseStarted and, when it ends, ResponseComplete), at the time the API
server received it (`requestReceivedTimestamp`), so a window counts the requests that arrived in
it, watches still open included. The component comes from the request's User-Agent
(`COMPONENTS`); llmfleet's own components name themselves (`llmfleet.core.kube.user_agent`).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

Key = tuple[str, str, str]
"""(component, verb, resource[/subresource]); a request to no resource has its path instead."""

COMPONENTS = (
    ("llmfleet-operator/", "llmfleet-operator"),
    ("llmfleet-gateway/", "llmfleet-gateway"),
    ("llmfleet-autoscaler/", "llmfleet-autoscaler"),
    ("kube-controller-manager/", "kube-controller-manager"),
    ("kube-scheduler/", "kube-scheduler"),
    ("kube-apiserver/", "kube-apiserver"),
    ("kwok-controller/", "kwok-controller"),
    ("kubectl/", "kubectl"),
    # An operator on kopf that does not name itself (one from before the components did).
    ("kopf/", "kopf (unnamed)"),
    # The Kubernetes Python client's default: any llmfleet component that does not name itself.
    ("OpenAPI-Generator/", "python client (unnamed)"),
)
"""User-Agent prefix -> component, first match wins; anything else is `other`."""

WRITES = frozenset({"create", "update", "patch", "delete", "deletecollection"})
"""The audit log's verbs that change something (server-side apply is a `patch`)."""


def component_of(user_agent: str) -> str:
    for prefix, component in COMPONENTS:
        if user_agent.startswith(prefix):
            return component
    return "other"


def _received(event: Mapping[str, Any]) -> datetime:
    """The request's arrival, timezone-aware (the log writes RFC 3339 in UTC)."""
    return datetime.fromisoformat(event["requestReceivedTimestamp"])


def key_of(event: Mapping[str, Any]) -> Key:
    ref = event.get("objectRef")
    if ref and ref.get("resource"):
        resource = ref["resource"]
        if ref.get("subresource"):
            resource += f"/{ref['subresource']}"
    else:
        resource = event.get("requestURI", "").split("?", 1)[0]
    return (component_of(event.get("userAgent", "")), event.get("verb", ""), resource)


def counts(lines: Iterable[str], start: datetime, end: datetime) -> Counter[Key]:
    """Requests received in [start, end), each counted once whatever stages it logged; lines
    that are not audit events (a line cut by rotation) are skipped."""
    seen: set[str] = set()
    found: Counter[Key] = Counter()
    for line in lines:
        try:
            event = json.loads(line)
            received = _received(event)
        except (ValueError, KeyError, TypeError):
            continue
        audit_id = event.get("auditID", "")
        if not start <= received < end or audit_id in seen:
            continue
        seen.add(audit_id)
        found[key_of(event)] += 1
    return found


def rates(lines: Iterable[str], start: datetime, end: datetime) -> dict[Key, float]:
    """Requests per second by `Key` over [start, end)."""
    seconds = (end - start).total_seconds()
    return {key: count / seconds for key, count in counts(lines, start, end).items()}


def log_files(log: Path, since: float) -> list[Path]:
    """The log and its rotated copies (`audit-<time>.log`) last written at or after `since`."""
    files = sorted(log.parent.glob(f"{log.stem}*{log.suffix}"))
    return [path for path in files if path.stat().st_mtime >= since]


def read_rates(log: Path, start: float, end: float) -> dict[Key, float]:
    """`rates` over the wall-clock window [start, end) (`time.time()`), from every log file."""

    def lines() -> Iterable[str]:
        for path in log_files(log, start):
            with path.open() as text:
                yield from text

    return rates(lines(), datetime.fromtimestamp(start, UTC), datetime.fromtimestamp(end, UTC))


def table(columns: Mapping[str, Mapping[Key, float]]) -> list[str]:
    """One line per (component, verb, resource) in any column, then each component's writes and
    reads; the request rates of each column side by side."""
    names = list(columns)

    def row(title: str, values: Iterable[float]) -> str:
        return f"{title:70}" + "".join(f"{value:>28.2f}" for value in values)

    lines = [f"{'component verb resource':70}" + "".join(f"{name:>28}" for name in names)]
    keys = sorted({key for column in columns.values() for key in column})
    lines += [row(" ".join(key), (columns[n].get(key, 0.0) for n in names)) for key in keys]
    for component in sorted({key[0] for key in keys}):
        for title, writes in (("writes", True), ("reads", False)):
            totals = (
                sum(rate for (c, verb, _), rate in columns[n].items()
                    if c == component and (verb in WRITES) == writes)
                for n in names
            )  # fmt: skip
            lines.append(row(f"{component}: all {title}", totals))
    return lines


def section(log: Path | None, windows: Mapping[str, tuple[float, float]]) -> list[str]:
    """The benchmark's by-component section: `table` over each column's idle window
    (`time.time()` start and end), or one line saying why there is none."""
    if log is None or not log.is_file():
        why = "a cluster given with --kubeconfig, or one started without it"
        return [f"\nno audit log ({why}): no requests by component"]
    columns = {name: read_rates(log, start, end) for name, (start, end) in windows.items()}
    title = "\nAPI requests per second by component (the API server's audit log, by User-Agent)"
    return [title, *table(columns)]
