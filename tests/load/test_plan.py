"""`llmfleet load`'s plan: send times under --speed and --duration, prompts of the trace's
lengths, and Mooncake hash ids as shared prefixes (in text and in the gateway's prefix key)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from llmfleet.autoscaler.sim.load.plan import WORD_CHARS, WORDS, PlannedRequest, PromptBuilder, plan
from llmfleet.autoscaler.sim.load.replay import request_body
from llmfleet.autoscaler.sim.traces import Request, Trace, load
from llmfleet.core.errors import UserError
from llmfleet.gateway.openai_request import parse
from llmfleet.gateway.settings import GatewaySettings

# llm-d-inference-sim's dummy tokenizer (pkg/tokenizer/tokenizer.go): one token per match.
DUMMY_TOKEN = re.compile(
    r"""(\{|\}|:|,|-|\.|\?|\!|;|@|#|\$|%|\^|&|\*|\(|\)|\+|\-|_|~|/|\\|>|<|\[|\]|=|"|'|\w+)(\s*)"""
)


def _trace(*arrivals: float) -> Trace:
    return Trace("t", "mooncake", tuple(Request(a, 10, 5) for a in arrivals))


@pytest.mark.parametrize(
    ("speed", "duration", "sends"),
    [
        pytest.param(1.0, None, [0.0, 0.5, 2.0, 4.0], id="as-recorded"),
        pytest.param(2.0, None, [0.0, 0.25, 1.0, 2.0], id="twice-as-fast"),
        pytest.param(0.5, None, [0.0, 1.0, 4.0, 8.0], id="half-speed"),
        pytest.param(1.0, 2.0, [0.0, 0.5], id="duration-cuts-at-the-send-time"),
        pytest.param(2.0, 2.0, [0.0, 0.25, 1.0], id="duration-counts-replay-seconds"),
        pytest.param(1.0, 100.0, [0.0, 0.5, 2.0, 4.0], id="duration-beyond-the-trace"),
    ],
)
def test_send_times(speed: float, duration: float | None, sends: list[float]) -> None:
    planned = plan(_trace(0.0, 0.5, 2.0, 4.0), speed=speed, duration_s=duration)
    assert [p.send_at for p in planned] == sends
    assert [p.index for p in planned] == list(range(len(sends)))


@pytest.mark.parametrize(
    ("speed", "duration"),
    [pytest.param(0.0, None, id="zero-speed"), pytest.param(1.0, 0.0, id="zero-duration")],
)
def test_nonsense_speed_or_duration_is_a_user_error(speed: float, duration: float | None) -> None:
    with pytest.raises(UserError, match="above 0"):
        plan(_trace(0.0), speed=speed, duration_s=duration)


def test_lengths_come_from_the_trace(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    rows = [
        {"timestamp": 0, "input_length": 700, "output_length": 9, "hash_ids": [1, 2]},
        {"timestamp": 1500, "input_length": 3, "output_length": 1, "hash_ids": [1]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    planned = plan(load(path))
    assert [(p.send_at, p.prompt_tokens, p.max_tokens, p.blocks) for p in planned] == [
        (0.0, 700, 9, (1, 2)),
        (1.5, 3, 1, (1,)),
    ]


def _request(tokens: int, blocks: tuple[int, ...] = (), index: int = 0) -> PlannedRequest:
    return PlannedRequest(index, 0.0, tokens, 8, blocks)


@pytest.mark.parametrize(
    "request_",
    [
        pytest.param(_request(1), id="one-token"),
        pytest.param(_request(2048), id="azure-no-blocks"),
        pytest.param(_request(700, (1, 2)), id="partial-last-block"),
        pytest.param(_request(1024, (1, 2)), id="whole-blocks"),
        pytest.param(_request(1500, (1, 2)), id="beyond-the-blocks"),
        pytest.param(_request(100, (1, 2, 3)), id="more-blocks-than-tokens"),
    ],
)
def test_a_prompt_is_one_word_per_token(request_: PlannedRequest) -> None:
    prompt = PromptBuilder(7).prompt(request_)
    assert len(DUMMY_TOKEN.findall(prompt)) == request_.prompt_tokens  # what the engine counts
    assert len(prompt) == WORD_CHARS * request_.prompt_tokens  # what the gateway estimates
    words = prompt.split(" ")
    assert words[-1] == ""  # every word ends with its space
    assert all(word + " " in WORDS for word in words[:-1])


def test_the_same_hash_id_is_the_same_text_and_prefix_key() -> None:
    builder = PromptBuilder(7)
    a = builder.prompt(_request(900, (1, 2), index=0))
    b = builder.prompt(_request(1200, (1, 3), index=1))
    c = builder.prompt(_request(900, (4, 2), index=2))
    block = 512 * WORD_CHARS
    assert a[:block] == b[:block] == builder.block(1)
    assert a[block:] != b[block : len(a)]  # second blocks differ: 2 vs 3
    assert c[:block] != a[:block]
    assert c[block:] == a[block:]  # block 2 is the same text wherever it appears
    # The gateway's prefix-affinity key (its first 8 blocks of 256 characters = 512 words):
    settings = GatewaySettings()

    def key(prompt: str) -> int | None:
        body = json.dumps(request_body("m", prompt, 8)).encode()
        return parse(body, chat=False).prefix_key(
            settings.prefix_block_chars, settings.prefix_blocks
        )

    assert key(a) == key(b)
    assert key(a) != key(c)


def test_unique_text_differs_per_request_and_seed() -> None:
    one, other = PromptBuilder(1), PromptBuilder(2)
    assert one.prompt(_request(64, index=0)) != one.prompt(_request(64, index=1))
    assert one.prompt(_request(64, index=0)) == PromptBuilder(1).prompt(_request(64, index=0))
    assert one.prompt(_request(64, index=0)) != other.prompt(_request(64, index=0))
    assert one.block(5) != other.block(5)
