"""Prometheus' instant query over HTTP, shared by the autoscaler's signals and the operator's
canary analysis (issue 28).

The query travels in the body of `POST /api/v1/query` (`application/x-www-form-urlencoded`,
which Prometheus' HTTP API accepts as it accepts the URL's parameters), never in the URL. The
autoscaler's full pass selects up to `QUERY_CHUNK_SERVICES` (100) services by a regex of their
names in each of its ~16 signals: about 30 KB of query. Sent in the URL (as
`prometheus_api_client.custom_query` sent it, even with POST), that is a request line that
proxies and load balancers in front of Prometheus commonly refuse with 414 URI Too Long (nginx's
`large_client_header_buffers` is 8 KB by default; Thanos and Mimir query front-ends sit behind
such limits too). A body has no such limit short of Prometheus' own 10 MB form limit.

The session makes no retries inside a call (the caller's next pass is the retry) and, with
`redirects=False`, follows no redirect (a redirect could lead off loopback, past the loopback
guard's check of the URL, which the caller makes before each call).
"""

from __future__ import annotations

from typing import Any

import orjson
import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry


class QueryRefused(Exception):
    """Prometheus answered with another status than 200 (the message says which, and the
    answer's body: Prometheus' `error` for a query it cannot parse)."""


def session(*, redirects: bool = True) -> requests.Session:
    """A session for `instant_query`: no retries; no redirects unless `redirects`."""
    made = requests.Session()
    adapter = HTTPAdapter(max_retries=Retry(total=0, raise_on_status=False))
    made.mount("http://", adapter)
    made.mount("https://", adapter)
    if not redirects:
        made.max_redirects = 0
    return made


def instant_query(
    client: requests.Session, url: str, query: str, timeout_s: float
) -> list[dict[str, Any]]:
    """The `data.result` of the instant `query` at Prometheus `url` (no trailing slash), asked
    in a form-encoded POST body. Raises `QueryRefused` for a status other than 200, requests'
    errors (OSError) when Prometheus cannot be reached or does not answer within `timeout_s`,
    and ValueError, KeyError or TypeError for an answer that is not Prometheus' JSON (orjson
    decodes it: the autoscaler's full pass reads ~7 MB of it at 1,000 services x 10 pods)."""
    response = client.post(f"{url}/api/v1/query", data={"query": query}, timeout=timeout_s)
    if response.status_code != 200:
        # The wording `prometheus_api_client` used: the callers' reasons quote it.
        raise QueryRefused(f"HTTP Status Code {response.status_code} ({response.content!r})")
    result: list[dict[str, Any]] = orjson.loads(response.content)["data"]["result"]
    return result
