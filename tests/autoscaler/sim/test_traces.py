"""Trace readers: both formats, and bad lines named by file and line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmfleet.autoscaler.sim.traces import TraceError, load
from llmfleet.core.errors import UserError

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def test_azure_rows_become_requests_in_seconds_from_the_first(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(
        AZURE_HEADER
        + "2023-11-16 18:17:04.5000000,100,5\n"
        + "2023-11-16 18:17:03.9799600,4808,10\n"
    )
    trace = load(path)
    assert trace.kind == "azure"
    assert [(r.arrival, r.prompt_tokens, r.output_tokens) for r in trace.requests] == [
        (0.0, 4808, 10),
        (pytest.approx(0.52004), 100, 5),
    ]
    assert trace.requests[0].blocks == ()


def test_mooncake_lines_keep_their_hash_blocks(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    lines = [
        {"timestamp": 1500, "input_length": 600, "output_length": 3, "hash_ids": [0, 1]},
        {"timestamp": 500, "input_length": 10, "output_length": 1, "hash_ids": [0]},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    trace = load(path)
    assert trace.kind == "mooncake"
    assert [(r.arrival, r.blocks) for r in trace.requests] == [(0.0, (0,)), (1.0, (0, 1))]


def test_limit_keeps_the_first_seconds(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(
        "\n".join(
            json.dumps({"timestamp": t * 1000, "input_length": 5, "output_length": 2})
            for t in range(10)
        )
    )
    assert len(load(path, limit_s=4.5).requests) == 5


@pytest.mark.parametrize(
    ("name", "content", "where", "what"),
    [
        pytest.param(
            "bad.csv",
            AZURE_HEADER + "2023-11-16 18:17:03.9,10,2\nnot a date,1,1\n",
            ":3",
            "TIMESTAMP",
            id="azure-bad-timestamp",
        ),
        pytest.param(
            "bad.csv",
            AZURE_HEADER + "2023-11-16 18:17:03.9,ten,2\n",
            ":2",
            "ContextTokens",
            id="azure-non-integer",
        ),
        pytest.param(
            "bad.csv",
            AZURE_HEADER + "2023-11-16 18:17:03.9,10\n",
            ":2",
            "3 columns",
            id="azure-missing-column",
        ),
        pytest.param("bad.csv", "a,b,c\n", ":1", "header", id="azure-wrong-header"),
        pytest.param(
            "bad.jsonl",
            '{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1,\n',
            ":2",
            "not JSON",
            id="mooncake-broken-json",
        ),
        pytest.param(
            "bad.jsonl",
            '{"timestamp": 0, "input_length": 5}\n',
            ":1",
            "output_length",
            id="mooncake-missing-field",
        ),
        pytest.param(
            "bad.jsonl",
            '{"timestamp": 0, "input_length": 5, "output_length": 0}\n',
            ":1",
            "at least 1",
            id="mooncake-zero-output",
        ),
        pytest.param(
            "bad.jsonl",
            '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": ["a"]}\n',
            ":1",
            "hash_ids",
            id="mooncake-bad-hashes",
        ),
    ],
)
def test_a_malformed_line_names_file_and_line(
    tmp_path: Path, name: str, content: str, where: str, what: str
) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(TraceError) as caught:
        load(path)
    message = str(caught.value)
    assert f"{path}{where}:" in message
    assert what in message
    assert isinstance(caught.value, UserError)


@pytest.mark.parametrize(
    ("name", "what"),
    [("missing.csv", "no such trace"), ("trace.txt", "unknown trace format")],
)
def test_unreadable_paths_are_user_errors(tmp_path: Path, name: str, what: str) -> None:
    path = tmp_path / name
    if name.endswith(".txt"):
        path.write_text("x")
    with pytest.raises(TraceError, match=what):
        load(path)
