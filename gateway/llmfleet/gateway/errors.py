"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with its status.

Clients (the official SDKs included) map the status to an exception class and show `message`,
so every message says what happened and, where it can, what to do.
"""

from __future__ import annotations

import json

from starlette.responses import Response

_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}


def error_body(
    status: int, message: str, *, param: str | None = None, code: str | None = None
) -> bytes:
    error = {"message": message, "type": _TYPES.get(status, "error"), "param": param, "code": code}
    return json.dumps({"error": error}).encode()


def error_response(
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    return Response(
        error_body(status, message, param=param, code=code),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


def stream_error_event(status: int, message: str, code: str) -> bytes:
    """An SSE event that ends a stream with an error (the OpenAI SDK raises on `error`)."""
    return b"data: " + error_body(status, message, code=code) + b"\n\n"
