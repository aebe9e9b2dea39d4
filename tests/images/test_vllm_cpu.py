"""The CPU engine's recipe (core/llmfleet/core/images/vllm_cpu.py): what it pins and the name it
gives vLLM's CLI. Building it is `llmfleet images vllm-cpu`; tests/runtime/test_real_vllm_cpu.py
runs what it built."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest

from llmfleet.core.images import vllm_cpu
from llmfleet.core.images.builder import source_root

LOCK = source_root() / vllm_cpu.SOURCE / "requirements.lock"
PINNED = re.compile(r"^([a-z0-9-]+)==(\S+) --hash=sha256:[0-9a-f]{64}$")


def _pins() -> dict[str, str]:
    lines = [line for line in LOCK.read_text().splitlines() if line and not line.startswith("#")]
    pins = {}
    for line in lines:
        match = PINNED.match(line)
        assert match, f"not `name==version --hash=sha256:…`: {line}"
        assert match[1] not in pins, f"{match[1]} twice"
        pins[match[1]] = match[2]
    return pins


@pytest.mark.parametrize(
    ("name", "version"),
    [("vllm-cpu", vllm_cpu.VERSION), ("torch", "2.13.0"), ("torchvision", "0.28.0"),
     ("transformers", None), ("tokenizers", None), ("safetensors", None)],
)  # fmt: skip
def test_the_lock_pins_what_the_engine_and_the_model_need(name: str, version: str | None) -> None:
    pins = _pins()
    assert name in pins
    assert version is None or pins[name] == version


def test_the_key_follows_the_lock_and_the_model_script(tmp_path: Path) -> None:
    copy = tmp_path / vllm_cpu.SOURCE
    copy.mkdir(parents=True)
    for name in ("requirements.lock", "make_model.py"):
        (copy / name).write_bytes((source_root() / vllm_cpu.SOURCE / name).read_bytes())
    first = vllm_cpu.key(tmp_path)
    assert first == vllm_cpu.key(source_root())
    assert first.startswith(f"{vllm_cpu.VERSION}-")
    for name in ("requirements.lock", "make_model.py"):
        with (copy / name).open("a") as handle:
            handle.write("\n# changed\n")
        assert vllm_cpu.key(tmp_path) != first
        first = vllm_cpu.key(tmp_path)


def test_vllm_finds_its_name_and_a_cpu_version(tmp_path: Path) -> None:
    """vLLM's CLI asks for the distribution `vllm`; its platform check wants `cpu` in the
    version."""
    site = tmp_path / "lib" / f"python{vllm_cpu.PYTHON_VERSION}" / "site-packages"
    site.mkdir(parents=True)
    vllm_cpu._add_vllm_name(tmp_path)
    (found,) = importlib.metadata.distributions(name="vllm", path=[str(site)])
    assert found.version == f"{vllm_cpu.VERSION}+cpu"
    assert "cpu" in found.version


def test_not_built_is_none_in_an_empty_cache(tmp_path: Path) -> None:
    assert vllm_cpu.built(source_root(), root=tmp_path) is None
