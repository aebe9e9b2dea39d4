"""The instant query's wire (`llmfleet.core.prometheus_http`, issue 28): the autoscaler's
signals and the operator's canary analysis ask Prometheus in a form-encoded POST body, once
(no retry), follow no redirect with the loopback guard on, and say what an error answer was."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from typing import ClassVar

import pytest

from llmfleet.autoscaler.signals import PrometheusSignals, SignalsUnavailable
from llmfleet.core.loopback import LoopbackGuard
from llmfleet.operator.analyst import AnalysisUnavailable, PrometheusAnalyst
from tests.net import posted_query, require_isolation, served


class _Stub(BaseHTTPRequestHandler):
    """A Prometheus that keeps each query it was asked and answers `status` (200: an empty
    vector; 302: a redirect to itself)."""

    status: ClassVar[int] = 200
    asked: ClassVar[list[str]] = []
    text: ClassVar[bytes | None] = None
    """Answered with status 200 instead of Prometheus' JSON when set (a proxy's page)."""

    def do_POST(self) -> None:
        type(self).asked.append(posted_query(self))
        if self.status == 302:
            self.send_response(302)
            self.send_header("Location", "/api/v1/query")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = {"status": "success", "data": {"resultType": "vector", "result": []}}
        if self.status != 200:
            body = {"status": "error", "errorType": "bad_data", "error": "stubbed"}
        encoded = json.dumps(body).encode() if self.text is None else self.text
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(encoded)))
        self.end_headers()
        self.wfile.write(encoded)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def stub() -> Iterator[str]:
    require_isolation()
    _Stub.status, _Stub.asked, _Stub.text = 200, [], None
    with served(_Stub) as url:
        yield url


Ask = Callable[[str, LoopbackGuard | None], object]


def _signals(url: str, guard: LoopbackGuard | None) -> object:
    signals = PrometheusSignals(url, timeout_s=2, guard=guard)
    try:
        return signals.read_all("ns", "chat")
    finally:
        signals.close()


def _analysis(url: str, guard: LoopbackGuard | None) -> object:
    analyst = PrometheusAnalyst(url, timeout_s=2, guard=guard)
    try:
        return analyst.measure("ns", "chat", "rev-2", 60)
    finally:
        analyst.close()


READERS = [
    pytest.param(_signals, SignalsUnavailable, 'llmfleet_dev_service="chat"', id="signals"),
    pytest.param(_analysis, AnalysisUnavailable, 'service="chat"', id="analysis"),
]


@pytest.mark.parametrize(("ask", "unavailable", "selects"), READERS)
def test_the_query_is_a_form_body_asked_once(
    stub: str, ask: Ask, unavailable: type[Exception], selects: str
) -> None:
    ask(stub, None)
    assert len(_Stub.asked) == 1
    assert selects in _Stub.asked[0]


@pytest.mark.parametrize(("ask", "unavailable", "selects"), READERS)
def test_an_error_answer_is_unavailable_after_one_request(
    stub: str, ask: Ask, unavailable: type[Exception], selects: str
) -> None:
    _Stub.status = 503
    with pytest.raises(unavailable, match=r"HTTP Status Code 503 \(b'.*stubbed"):
        ask(stub, None)
    assert len(_Stub.asked) == 1


@pytest.mark.parametrize(("ask", "unavailable", "selects"), READERS)
def test_no_redirect_is_followed_with_the_guard_on(
    stub: str, ask: Ask, unavailable: type[Exception], selects: str
) -> None:
    _Stub.status = 302
    with pytest.raises(unavailable, match="redirects"):
        ask(stub, LoopbackGuard(True))
    assert len(_Stub.asked) == 1


@pytest.mark.parametrize(("ask", "unavailable", "selects"), READERS)
@pytest.mark.parametrize(
    "text",
    [b"<html>sign in</html>", b'{"status": "success"}', b""],
    ids=["html", "no-data", "empty"],
)
def test_an_answer_that_is_not_prometheus_json_is_unavailable(
    stub: str, ask: Ask, unavailable: type[Exception], selects: str, text: bytes
) -> None:
    _Stub.text = text
    with pytest.raises(unavailable):
        ask(stub, None)
