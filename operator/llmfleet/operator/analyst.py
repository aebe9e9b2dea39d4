"""The canary analysis' one door to Prometheus: one query per analysis (see `analysis.py`).

No retries inside a call (the next analysis is the retry) and a timeout per call: an
unreachable Prometheus costs one pass at most `timeout_s` and gives an `Unavailable` verdict,
on which the rollout holds (never promotes blind). The query (~3 KB, one service's) goes in a
form-encoded POST body as the autoscaler's do (`llmfleet.core.prometheus_http`), so a proxy's
URL limit in front of Prometheus never decides whether a canary is judged.
"""

from __future__ import annotations

import re

from llmfleet.core import prometheus_http
from llmfleet.core.loopback import LoopbackGuard
from llmfleet.crds import InferenceServiceSpec
from llmfleet.operator.analysis import Figures, combined_query, judge, limits_for, parse, queries
from llmfleet.operator.rollout import Analysis, Verdict

_ERRNO = re.compile(r"\[Errno -?\d+\] [^'\")\]]+")
_QUERY = re.compile(r"\?query=\S+")


class AnalysisUnavailable(Exception):
    """Prometheus could not be asked (unreachable, an HTTP error, a malformed answer)."""


def _cause(error: Exception) -> str:
    """The OS error inside urllib3's wrapping when there is one, else the message without the
    encoded query."""
    text = str(error)
    found = _ERRNO.search(text)
    return found.group(0).strip() if found else _QUERY.sub("?query=...", text)


class PrometheusAnalyst:
    """Compares canary and stable from the Prometheus at `url`."""

    def __init__(self, url: str, *, timeout_s: float = 5.0, guard: LoopbackGuard | None = None):
        self.url = url.rstrip("/")
        self._guard = guard
        self._timeout_s = timeout_s
        # No redirect with the guard on: one could lead off loopback, past the check.
        self._session = prometheus_http.session(redirects=guard is None or not guard.enabled)

    def measure(
        self, namespace: str, service: str, canary: str, window_seconds: int
    ) -> dict[str, Figures]:
        """Figures of the `canary` and `stable` tracks over the last `window_seconds`."""
        query = combined_query(queries(namespace, service, canary, window_seconds))
        try:
            if self._guard is not None:
                self._guard.check_url(self.url, "prometheus")
            return parse(
                prometheus_http.instant_query(self._session, self.url, query, self._timeout_s)
            )
        except (OSError, prometheus_http.QueryRefused, KeyError, TypeError, ValueError) as error:
            # OSError covers requests' errors (connection refused, timeout, bad JSON).
            raise AnalysisUnavailable(f"Prometheus at {self.url}: {_cause(error)}") from error

    def analyse(
        self, spec: InferenceServiceSpec, namespace: str, service: str, canary: str
    ) -> Analysis:
        """The verdict on the last analysis interval; `Unavailable` when Prometheus cannot say."""
        limits = limits_for(spec)
        try:
            figures = self.measure(namespace, service, canary, limits.window_seconds)
        except AnalysisUnavailable as error:
            return Analysis(Verdict.UNAVAILABLE, str(error))
        return judge(figures["canary"], figures["stable"], limits)

    def close(self) -> None:
        self._session.close()
