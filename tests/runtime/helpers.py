"""Small helpers for the runtime tests: build configs and GPUs, read options off an argv."""

from __future__ import annotations

from typing import Any

from llmfleet.runtime.config import RuntimeConfig
from llmfleet.runtime.gpu import Gpu, lookup, parse_override


def gpu_of(spec: str) -> Gpu:
    gpu_type, count = parse_override(spec)
    return Gpu(lookup(gpu_type), count or 1, "env")


def config_of(data: dict[str, Any]) -> RuntimeConfig:
    return RuntimeConfig.model_validate(data)


def options_of(argv: list[str]) -> dict[str, str | None]:
    """`vllm serve MODEL --a 1 --b` -> {"--a": "1", "--b": None}; a repeated flag is an error."""
    assert argv[:2] == ["vllm", "serve"]
    options: dict[str, str | None] = {}
    flag: str | None = None
    for word in argv[3:]:
        if word.startswith("-"):
            assert word not in options, f"{word} appears twice in {argv}"
            options[word] = None
            flag = word
        else:
            assert flag is not None, f"value {word!r} before any option in {argv}"
            assert options[flag] is None, f"stray value {word!r} in {argv}"
            options[flag] = word
    return options
