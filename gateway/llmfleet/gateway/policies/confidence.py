"""How sure an answer is, from the log-probabilities of its tokens (pure; no I/O).

Inputs: an OpenAI-shaped answer, non-streaming (one JSON object) or streamed (its chunks, in
order), returned with logprobs on: chat `choices[i].logprobs.content[j].logprob`, completions
`choices[i].logprobs.token_logprobs[j]` (a `null` entry, as engines send for an echoed first
prompt token, is left out). Tokens are grouped by choice `index`.

Confidence of one choice, p_j = exp(logprob_j) its tokens' probabilities, in [0, 1]:

    MeanProbability        mean(p_j) over all tokens
    MinWindowProbability   min over every run of `window` consecutive tokens of mean(p_j);
                           a choice shorter than the window: the mean over all its tokens

Confidence of an answer: the lowest of its choices' (every choice must be confident). An answer
with no choices, or a choice with no token logprobs (the engine ignored the request for them),
has confidence 0, so a cascade escalates it rather than trusting an answer it cannot judge.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from llmfleet.crds.policy import ConfidenceMethod


def mean_probability(logprobs: Sequence[float]) -> float:
    """Mean token probability; 0 for no tokens."""
    if not logprobs:
        return 0.0
    return sum(math.exp(value) for value in logprobs) / len(logprobs)


def min_window_probability(logprobs: Sequence[float], window: int) -> float:
    """Lowest mean token probability over `window` consecutive tokens (all of them when there
    are fewer); 0 for no tokens. A sliding sum: O(tokens)."""
    if not logprobs:
        return 0.0
    probabilities = [math.exp(value) for value in logprobs]
    width = min(max(window, 1), len(probabilities))
    running = sum(probabilities[:width])
    lowest = running
    for i in range(width, len(probabilities)):
        running += probabilities[i] - probabilities[i - width]
        lowest = min(lowest, running)
    return max(0.0, lowest / width)  # the sliding sum may dip a hair below 0 by rounding


def confidence(
    method: ConfidenceMethod, choices: Mapping[int, Sequence[float]], window: int
) -> float:
    """An answer's confidence: its least confident choice's; 0 without any choice."""
    if not choices:
        return 0.0
    if method is ConfidenceMethod.MIN_WINDOW_PROBABILITY:
        return min(min_window_probability(tokens, window) for tokens in choices.values())
    return min(mean_probability(tokens) for tokens in choices.values())


def answer_logprobs(answers: Iterable[Mapping[str, Any]]) -> dict[int, list[float]]:
    """Token logprobs by choice index of an answer: one JSON object (non-streaming), or its
    stream's chunks in order. A choice present without logprobs maps to an empty list."""
    found: dict[int, list[float]] = {}
    for answer in answers:
        choices = answer.get("choices")
        if not isinstance(choices, list):
            continue
        for position, choice in enumerate(choices):
            if not isinstance(choice, dict):
                continue
            index = choice.get("index", position)
            tokens = found.setdefault(index if isinstance(index, int) else position, [])
            tokens.extend(_choice_logprobs(choice.get("logprobs")))
    return found


def _choice_logprobs(logprobs: Any) -> list[float]:
    if not isinstance(logprobs, dict):
        return []
    content = logprobs.get("content")  # chat
    if isinstance(content, list):
        values = [item.get("logprob") for item in content if isinstance(item, dict)]
    else:  # completions
        values = logprobs.get("token_logprobs") or []
    return [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
