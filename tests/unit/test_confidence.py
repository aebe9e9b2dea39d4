"""The confidence of an answer from its token logprobs (`policies/confidence`), as tables."""

from __future__ import annotations

import math
from typing import Any

import pytest

from llmfleet.crds.policy import ConfidenceMethod
from llmfleet.gateway.policies.confidence import (
    answer_logprobs,
    confidence,
    mean_probability,
    min_window_probability,
)

MEAN = ConfidenceMethod.MEAN_PROBABILITY
WINDOW = ConfidenceMethod.MIN_WINDOW_PROBABILITY


def ln(*probabilities: float) -> list[float]:
    return [math.log(p) for p in probabilities]


@pytest.mark.parametrize(
    ("probabilities", "expected"),
    [
        pytest.param((), 0.0, id="no-tokens-is-zero"),
        pytest.param((0.9,), 0.9, id="one-token"),
        pytest.param((0.9, 0.5, 0.7), 0.7, id="mean-of-probabilities"),
        pytest.param((1.0, 1.0), 1.0, id="certain"),
    ],
)
def test_mean_probability(probabilities: tuple[float, ...], expected: float) -> None:
    assert mean_probability(ln(*probabilities)) == pytest.approx(expected)


def test_mean_probability_is_not_the_probability_of_the_mean_logprob() -> None:
    # exp(mean(logprob)) would be the geometric mean, 0.3; the documented mean is 0.5
    assert mean_probability(ln(0.9, 0.1)) == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("probabilities", "window", "expected"),
    [
        pytest.param((), 4, 0.0, id="no-tokens-is-zero"),
        pytest.param((0.9, 0.5), 4, 0.7, id="fewer-tokens-than-window-uses-all"),
        pytest.param((0.9, 0.9, 0.1, 0.2, 0.9, 0.9), 2, 0.15, id="one-unsure-stretch"),
        pytest.param(
            (0.9, 0.9, 0.1, 0.2, 0.9, 0.9),
            6,
            0.65,
            id="window-of-all-is-the-mean",
        ),
        pytest.param((0.2, 0.9, 0.9, 0.9), 1, 0.2, id="window-of-one-is-the-minimum"),
        pytest.param((0.9, 0.9, 0.9, 0.3), 3, 0.7, id="last-window-counts"),
    ],
)
def test_min_window_probability(
    probabilities: tuple[float, ...], window: int, expected: float
) -> None:
    assert min_window_probability(ln(*probabilities), window) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("method", "choices", "expected"),
    [
        pytest.param(MEAN, {}, 0.0, id="no-choice-is-zero"),
        pytest.param(MEAN, {0: []}, 0.0, id="choice-without-logprobs-is-zero"),
        pytest.param(MEAN, {0: ln(0.9, 0.9), 1: ln(0.5)}, 0.5, id="least-confident-choice"),
        pytest.param(WINDOW, {0: ln(0.9, 0.1, 0.9, 0.9)}, 0.5, id="min-window-of-2"),
    ],
)
def test_confidence_of_an_answer(
    method: ConfidenceMethod, choices: dict[int, list[float]], expected: float
) -> None:
    assert confidence(method, choices, window=2) == pytest.approx(expected)


def _chat_token(logprob: float) -> dict[str, Any]:
    return {"token": "t", "logprob": logprob, "bytes": None, "top_logprobs": []}


@pytest.mark.parametrize(
    ("answers", "expected"),
    [
        pytest.param(
            [{"choices": [{"index": 0, "logprobs": {"content": [_chat_token(-1.0)] * 2}}]}],
            {0: [-1.0, -1.0]},
            id="chat-whole",
        ),
        pytest.param(
            [
                {
                    "choices": [
                        {
                            "index": 0,
                            "text": "ab",
                            "logprobs": {"tokens": ["a", "b"], "token_logprobs": [None, -0.5]},
                        }
                    ]
                }
            ],
            {0: [-0.5]},
            id="completions-null-token-left-out",
        ),
        pytest.param(
            [
                {"choices": [{"index": 0, "delta": {"role": "assistant"}}]},
                {"choices": [{"index": 0, "logprobs": {"content": [_chat_token(-0.1)]}}]},
                {"choices": [{"index": 1, "logprobs": {"content": [_chat_token(-0.2)]}}]},
                {"choices": [{"index": 0, "logprobs": {"content": [_chat_token(-0.3)]}}]},
                {"choices": [], "usage": {"total_tokens": 3}},
            ],
            {0: [-0.1, -0.3], 1: [-0.2]},
            id="chat-stream-chunks-by-choice",
        ),
        pytest.param(
            [{"choices": [{"index": 0, "message": {"content": "x"}, "logprobs": None}]}],
            {0: []},
            id="engine-ignored-the-request",
        ),
        pytest.param([{"error": {"message": "x"}}], {}, id="no-choices"),
    ],
)
def test_answer_logprobs(answers: list[dict[str, Any]], expected: dict[int, list[float]]) -> None:
    assert answer_logprobs(answers) == expected
