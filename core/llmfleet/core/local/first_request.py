"""The first request `llmfleet up` prints, and the wait until it would be answered.

`up` returns once the chart's pods serve, but the samples' engine pods start after that (image
pull, the launcher's warm-up). Printing the first request then would hand the user a 503, so
`up` ends only when that very request, sent through the relayed gateway port, is answered.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

MODEL = "qwen-7b"
"""The sample model the printed first request names."""
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}]}
"""The printed first request's body (`curl -d`)."""

Say = Callable[[str], None]


class NotAnswered(Exception):
    """The first request was not answered in time (the message gives the last answer)."""


def wait_answered(
    base_url: str,
    say: Say,
    timeout: float = 300,
    *,
    every: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Send the first request (one token) to `base_url` (the gateway's `/v1`) until it is
    answered 200; returns the seconds it took. Raises `NotAnswered` after `timeout`."""
    started = clock()
    said = False
    last = "no answer yet"
    body = {**BODY, "max_tokens": 1}
    with httpx.Client(timeout=10) as client:
        while True:
            try:
                answer = client.post(f"{base_url}/chat/completions", json=body)
                if answer.status_code == 200:
                    return clock() - started
                last = f"{answer.status_code} {answer.text[:200]}"
            except httpx.HTTPError as error:
                last = f"{type(error).__name__}: {error}"
            if clock() - started > timeout:
                raise NotAnswered(
                    f"{MODEL} was not answered through the gateway within {timeout:.0f}s "
                    f"(last answer: {last}); `llmfleet status` shows its pods"
                )
            if not said:
                say(f"waiting until {MODEL} answers through the gateway (its engine pods start)")
                said = True
            sleep(every)
