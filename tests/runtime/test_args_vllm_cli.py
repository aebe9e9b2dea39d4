"""Every flag the launcher emits is one the pinned vLLM's `vllm serve` accepts.

The fixture is the real parser of vLLM 0.33.0 walked option by option
(runtime_image/scripts/vllm_cli_fixture.py). `python -m tests.runtime.dump_argvs FILE` writes every
argument list of the table to FILE; then parse them with the real parser:
`VLLM_TARGET_DEVICE=cpu /tmp/vllm-0.33.0/bin/python runtime_image/scripts/vllm_cli_fixture.py
--check FILE`.
"""

from __future__ import annotations

import json
import re
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from llmfleet.runtime import args
from llmfleet.runtime.args import plan_engine
from tests.runtime.cases import CASES, Case
from tests.runtime.helpers import config_of, gpu_of

REPO = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).parent / "fixtures" / "vllm-serve-cli.json"


@cache
def cli() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(FIXTURE.read_text())
    return data


def _argv(case: Case) -> list[str]:
    return plan_engine(config_of(case.config), gpu_of(case.gpu), pod_ip="10.0.0.7").argv


def test_fixture_is_of_the_pinned_vllm() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    pins = [p for p in pyproject["project"]["optional-dependencies"]["runtime"] if "vllm" in p]
    assert pins == [f"vllm=={cli()['vllm_version']}"]


def _check_option(flag: str, values: list[str]) -> None:
    spec = cli()["options"].get(flag)
    assert spec is not None, f"vLLM {cli()['vllm_version']} has no option {flag}"
    if not spec["takes_value"]:
        assert values == [], f"{flag} is a switch but got {values}"
        return
    if spec["nargs"] in ("+", "*"):
        assert values or spec["nargs"] == "*", f"{flag} needs values"
    else:
        assert len(values) == 1, f"{flag} takes one value, got {values}"
    if spec["choices"]:
        for value in values:
            assert value in spec["choices"], f"{flag} {value}: not one of {spec['choices']}"


def _check_json_values(options: dict[str, list[str]]) -> None:
    if "--kv-transfer-config" in options:
        body = json.loads(options["--kv-transfer-config"][0])
        assert body["kv_connector"] in cli()["kv_connectors"]
        assert body["kv_role"] in ("kv_producer", "kv_consumer", "kv_both")
    if "--speculative-config" in options:
        body = json.loads(options["--speculative-config"][0])
        assert body["method"] in cli()["speculative_methods"]
    if "--quantization" in options:
        assert options["--quantization"][0] in cli()["quantization_methods"]
    if "--optimization-level" in options:
        assert options["--optimization-level"][0] in ("0", "1", "2", "3")


def _group(argv: list[str]) -> dict[str, list[str]]:
    options: dict[str, list[str]] = {}
    flag = ""
    for word in argv[3:]:
        if word.startswith("-") and not re.fullmatch(r"-\d+(\.\d+)?", word):
            flag = word
            options[flag] = []
        else:
            options[flag].append(word)
    return options


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_emitted_flags_are_accepted_by_vllm(case: Case) -> None:
    options = _group(_argv(case))
    for flag, values in options.items():
        _check_option(flag, values)
    _check_json_values(options)


@pytest.mark.parametrize(
    ("name", "values", "key"),
    [
        pytest.param("CONNECTORS", args.CONNECTORS, "kv_connectors", id="kv-connectors"),
        pytest.param("SPECULATIVE_METHODS", args.SPECULATIVE_METHODS, "speculative_methods",
                     id="speculative-methods"),
        pytest.param("QUANTIZATIONS", args.QUANTIZATIONS, "quantization_methods",
                     id="quantizations"),
    ],
)  # fmt: skip
def test_accepted_values_exist_in_vllm(name: str, values: tuple[str, ...], key: str) -> None:
    missing = [value for value in values if value not in cli()[key]]
    assert missing == [], f"args.{name} has values vLLM does not know: {missing}"


def test_kv_cache_dtypes_exist_in_vllm() -> None:
    choices = cli()["options"]["--kv-cache-dtype"]["choices"]
    assert set(args.KV_CACHE_DTYPES) <= set(choices)


def test_the_check_catches_a_flag_vllm_does_not_have() -> None:
    with pytest.raises(AssertionError, match="has no option --enable-prefix-cache"):
        _check_option("--enable-prefix-cache", [])
    with pytest.raises(AssertionError, match="is a switch"):
        _check_option("--enforce-eager", ["1"])
    with pytest.raises(AssertionError, match="not one of"):
        _check_option("--kv-cache-dtype", ["fp7"])
