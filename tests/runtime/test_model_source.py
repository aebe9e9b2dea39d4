"""What `vllm serve` loads for each `model.source` (issue 27: the source is acted on)."""

from __future__ import annotations

from typing import Any

import pytest

from llmfleet.runtime.args import MODEL_SOURCE_DIR, model_to_load, plan_engine
from llmfleet.runtime.errors import ExitCode, LauncherError
from tests.runtime.helpers import config_of, gpu_of, options_of

PVC = MODEL_SOURCE_DIR
CASES = [
    ("none", {}, "org/model", None),
    ("hf", {"source": "hf://org/model"}, "org/model", None),
    ("hf other repo", {"source": "hf://org/model-fp8"}, "org/model-fp8", None),
    ("pvc with a path", {"source": "pvc://weights/llama/8b"}, f"{PVC}/weights/llama/8b", None),
    ("pvc trailing slash", {"source": "pvc://weights/8b/"}, f"{PVC}/weights/8b", None),
    ("pvc root", {"source": "pvc://weights"}, f"{PVC}/weights", None),
    ("s3", {"source": "s3://bucket/llama"}, "s3://bucket/llama", "runai_streamer"),
    ("gs", {"source": "gs://bucket/llama"}, "gs://bucket/llama", "runai_streamer"),
]  # fmt: skip


@pytest.mark.parametrize(("model", "loaded", "load_format"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_the_source_decides_what_vllm_loads(
    model: dict[str, Any], loaded: str, load_format: str | None
) -> None:
    config = config_of({"model": {"name": "org/model", "servedName": "chat", **model}})
    assert model_to_load(config)[0] == loaded
    plan = plan_engine(config, gpu_of("H100:1"))
    assert plan.argv[:3] == ["vllm", "serve", loaded]
    options = options_of(plan.argv)
    # Clients keep the name they know, wherever the weights come from.
    assert options["--served-model-name"] == "chat"
    assert options.get("--load-format") == load_format


def test_an_unknown_source_is_refused_by_name() -> None:
    config = config_of({"model": {"name": "m", "source": "ftp://host/m"}})
    with pytest.raises(LauncherError) as raised:
        model_to_load(config)
    assert raised.value.code is ExitCode.BAD_SPEC
    assert "ftp://host/m" in str(raised.value)
