"""The coalescing key (`policies/coalesce_key`): property tests and a table.

Properties: requests that differ in any field that can change the answer never share a key;
requests that differ only in key order and whitespace always do.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from llmfleet.gateway.policies.coalesce_key import coalesce_key, sampled_without_seed

CHAT = "/v1/chat/completions"

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant"]), "content": st.text(max_size=20)}
    ),
    min_size=1,
    max_size=3,
)
ANSWER_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "model": st.text(min_size=1, max_size=8),
    "messages": messages,
    "prompt": st.text(max_size=20) | st.lists(st.integers(0, 50_000), max_size=5),
    "temperature": st.floats(0, 2) | st.integers(0, 2),
    "top_p": st.floats(0, 1),
    "top_k": st.integers(-1, 100),
    "min_p": st.floats(0, 1),
    "max_tokens": st.integers(1, 4096),
    "max_completion_tokens": st.integers(1, 4096),
    "stop": st.text(max_size=4) | st.lists(st.text(max_size=4), max_size=3),
    "presence_penalty": st.floats(-2, 2),
    "frequency_penalty": st.floats(-2, 2),
    "logit_bias": st.dictionaries(st.integers(0, 999).map(str), st.integers(-100, 100), max_size=2),
    "tools": st.lists(json_values, max_size=2),
    "tool_choice": st.sampled_from(["auto", "none", "required"]) | json_values,
    "response_format": st.sampled_from([{"type": "text"}, {"type": "json_object"}]) | json_values,
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "n": st.integers(1, 4),
    "seed": st.integers(0, 2**31),
    "logprobs": st.booleans() | st.integers(0, 5),
    "top_logprobs": st.integers(0, 20),
    "user": st.text(max_size=8),
    "ignore_eos": st.booleans(),
}
"""Fields that can change the answer, with values a client may send (any other field too)."""

bodies = st.fixed_dictionaries(
    {"model": ANSWER_FIELDS["model"], "messages": messages},
    optional={
        name: values for name, values in ANSWER_FIELDS.items() if name not in {"model", "messages"}
    },
)


def _key(body: dict[str, Any], **scope: Any) -> str | None:
    values: dict[str, Any] = {"path": CHAT, "tenant": "team-a", "session": "s:one", **scope}
    return coalesce_key(body, **values)


def _shuffled(value: Any, rng: random.Random) -> Any:
    """The same JSON value with every object's keys in another order."""
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: _shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [_shuffled(v, rng) for v in value]
    return value


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


@given(
    body=bodies,
    rng=st.randoms(use_true_random=False),
    indent=st.none() | st.integers(0, 4) | st.just("\t"),
    separators=st.sampled_from([(",", ":"), (", ", ": "), (" ,\n", " :  ")]),
    ascii_only=st.booleans(),
)
def test_key_order_and_whitespace_never_matter(
    body: dict[str, Any],
    rng: random.Random,
    indent: int | str | None,
    separators: tuple[str, str],
    ascii_only: bool,
) -> None:
    raw = json.dumps(
        _shuffled(body, rng), indent=indent, separators=separators, ensure_ascii=ascii_only
    )
    again = json.loads(f"\n {raw} \t")  # as the gateway parses the client's bytes
    assert _key(again) == _key(body)
    assert _key(again) is not None


@given(body=bodies, field=st.sampled_from(sorted(ANSWER_FIELDS)), data=st.data())
def test_a_different_answer_field_never_shares_a_key(
    body: dict[str, Any], field: str, data: st.DataObject
) -> None:
    changed = dict(body)
    if field in body and data.draw(st.booleans(), label="remove it"):
        del changed[field]
    else:
        changed[field] = data.draw(ANSWER_FIELDS[field], label="new value")
    assume(_canonical(changed) != _canonical(body))
    assert _key(changed) != _key(body)


@given(body=bodies, name=st.text(min_size=1, max_size=8), a=json_values, b=json_values)
def test_any_other_field_also_separates_requests(
    body: dict[str, Any], name: str, a: Any, b: Any
) -> None:
    assume(_canonical(a) != _canonical(b))
    assert _key({**body, name: a}) != _key({**body, name: b})


@pytest.mark.parametrize(
    ("a", "b"),
    [
        pytest.param(1, 1.0, id="int-vs-float"),
        pytest.param(1, True, id="int-vs-bool"),
        pytest.param(0, None, id="zero-vs-null"),
        pytest.param("1", 1, id="string-vs-number"),
        pytest.param([1, 2], [2, 1], id="list-order"),
    ],
)
def test_json_types_and_list_order_stay_apart(a: Any, b: Any) -> None:
    body = {"model": "m", "prompt": "p", "temperature": 0}
    assert _key({**body, "top_k": a}) != _key({**body, "top_k": b})


@given(body=bodies)
def test_tenant_path_priority_and_tier_header_separate_requests(body: dict[str, Any]) -> None:
    keys = {
        _key(body),
        _key(body, tenant="team-b"),
        _key(body, tenant=None),
        _key(body, path="/v1/completions"),
        _key(body, priority="sheddable"),
        _key(body, headers={"x-llmfleet-tier": "large"}),
    }
    assert len(keys) == 6
    assert _key(body, headers={"x-other": "1"}) == _key(body)


SAMPLED = [
    pytest.param({}, True, id="no-temperature-is-openai-default-1"),
    pytest.param({"temperature": None}, True, id="null-temperature"),
    pytest.param({"temperature": 0.8}, True, id="temperature-0.8"),
    pytest.param({"temperature": 0}, False, id="temperature-0"),
    pytest.param({"temperature": 0.0, "top_p": 0.5}, False, id="greedy-with-top-p"),
    pytest.param({"temperature": 0.8, "seed": 7}, False, id="seeded"),
    pytest.param({"seed": 0}, False, id="seed-0-default-temperature"),
    pytest.param({"temperature": 0.8, "seed": None}, True, id="null-seed"),
    pytest.param({"temperature": "hot"}, True, id="unreadable-temperature"),
    pytest.param({"temperature": True}, True, id="boolean-temperature"),
]


@pytest.mark.parametrize(("fields", "sampled"), SAMPLED)
def test_which_requests_sample_without_a_seed(fields: dict[str, Any], sampled: bool) -> None:
    assert sampled_without_seed({"model": "m", "prompt": "p", **fields}) is sampled


@given(body=bodies)
def test_sampled_requests_share_only_within_a_session(body: dict[str, Any]) -> None:
    if sampled_without_seed(body):
        assert _key(body, session="s:one") != _key(body, session="s:two")
        assert _key(body, session=None) is None  # nobody to tie it to: never shared
    else:
        assert _key(body, session="s:one") == _key(body, session="s:two")
        assert _key(body, session=None) == _key(body)
