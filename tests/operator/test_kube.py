"""kube.py's pure parts: the apply body; transient answers end a pass (no call sleeps) and
set when it runs again. (Against the real API server: tests/cluster.)"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from kubernetes.client.exceptions import ApiException

from llmfleet.operator.answers import RETRYABLE_DELETE, Transient, asked
from llmfleet.operator.failures import requeue_delay
from llmfleet.operator.kube import apply_body


@pytest.mark.parametrize(
    ("text", "written"),
    [
        pytest.param("🚀", "🚀".encode(), id="emoji-as-utf8-not-a-surrogate-pair"),
        pytest.param("\U0001d518", "\U0001d518".encode(), id="mathematical-letter-as-utf8"),
        pytest.param("é", b"\\u00e9", id="latin-1-escaped"),
        pytest.param("中", b"\\u4e2d", id="cjk-escaped"),
        pytest.param("\u2028", b"\\u2028", id="line-separator-escaped-yaml-folds-it"),
        pytest.param("\x85", b"\\u0085", id="next-line-escaped-yaml-folds-it"),
        pytest.param("\x7f", b"\\u007f", id="delete-escaped-yaml-refuses-it"),
        pytest.param("\x9b", b"\\u009b", id="c1-control-escaped-yaml-refuses-it"),
        pytest.param("\uffff", b"\\uffff", id="non-character-escaped-yaml-refuses-it"),
        pytest.param("\x01", b"\\u0001", id="c0-control-escaped"),
        pytest.param('a"\\b', b'a\\"\\\\b', id="json-escapes-kept"),
    ],
)  # fmt: skip
def test_apply_body_writes_each_character_as_yaml_and_json_read_it(
    text: str, written: bytes
) -> None:
    manifest = {"data": {"key": f"<{text}>"}}
    body = apply_body(manifest)
    assert b"<" + written + b">" in body
    assert json.loads(body) == manifest
    assert b"\\ud8" not in body  # no surrogate escapes, ever
    assert b"\\udb" not in body


def answer(status: int, headers: dict[str, str] | None = None) -> ApiException:
    error = ApiException(status=status, reason="Reason")
    error.headers = headers
    return error


def raising(error: ApiException) -> Callable[[], str]:
    def call() -> str:
        raise error

    return call


@pytest.mark.parametrize(
    ("error", "transient", "after"),
    [
        pytest.param(answer(429, {"Retry-After": "3"}), True, 3.0, id="throttled-with-retry-after"),
        pytest.param(answer(429, {"retry-after": "1"}), True, 1.0, id="header-any-case"),
        pytest.param(answer(503), True, None, id="unavailable-without-retry-after"),
        pytest.param(answer(429, {"Retry-After": "Fri, 27 Nov 2026 18:00:00 GMT"}), True, None,
                     id="a-date-is-not-read"),
        pytest.param(answer(409), True, None, id="conflict"),
        pytest.param(answer(403), False, None, id="forbidden-is-a-refusal"),
        pytest.param(answer(422), False, None, id="invalid-is-a-refusal"),
    ],
)  # fmt: skip
def test_asked_raises_transient_answers_at_once_and_passes_refusals_on(
    error: ApiException, transient: bool, after: float | None
) -> None:
    with pytest.raises(Transient if transient else ApiException) as raised:
        asked(raising(error))
    if transient:
        assert isinstance(raised.value, Transient)
        assert (raised.value.error, raised.value.retry_after) == (error, after)
    else:
        assert raised.value is error


def test_asked_returns_what_the_call_returns_and_a_delete_s_conflict_is_a_refusal() -> None:
    assert asked(lambda: "answered") == "answered"
    with pytest.raises(ApiException):
        asked(raising(answer(409)), retryable=RETRYABLE_DELETE)


@pytest.mark.parametrize(
    ("failures", "retry_after", "delay"),
    [
        pytest.param(1, None, 2.0, id="first-back-off-step"),
        pytest.param(3, None, 8.0, id="doubling"),
        pytest.param(10, None, 60.0, id="capped"),
        pytest.param(1, 5.0, 5.0, id="the-server-asks-longer"),
        pytest.param(3, 1.0, 8.0, id="the-back-off-is-longer"),
        pytest.param(10, 120.0, 120.0, id="the-server-s-ask-past-the-cap"),
    ],
)  # fmt: skip
def test_a_failed_pass_requeues_after_its_back_off_or_the_server_s_retry_after(
    failures: int, retry_after: float | None, delay: float
) -> None:
    assert requeue_delay(failures, 2.0, 60.0, retry_after) == delay
