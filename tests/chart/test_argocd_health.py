"""The Argo CD health check for InferenceService (charts/llmfleet/files/argocd/health.lua), run
by a real Lua 5.1 interpreter (Debian's lua5.1: Argo CD runs these scripts with gopher-lua, a
Lua 5.1, whose numbers are all floats as 5.1's are) on sample objects the way Argo CD runs it:
`obj` a global holding the live object, the chunk returning {status, message}."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.monitoring import FILES, REPO

HEALTH = FILES / "argocd" / "health.lua"
LUA = "lua5.1"


def lua_string(text: str) -> str:
    """A Lua 5.1 string literal: UTF-8 bytes as they are, quotes, backslashes and control
    characters escaped as decimal `\\ddd` (5.1 has no `\\u`)."""
    escaped = "".join(
        f"\\{ord(char):03d}" if char in '"\\' or ord(char) < 32 else char for char in text
    )
    return f'"{escaped}"'


def lua_literal(value: Any) -> str:
    """A Lua table constructor for a JSON value (objects keyed by string, arrays 1-based)."""
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return lua_string(value)
    if isinstance(value, list):
        return "{" + ", ".join(lua_literal(item) for item in value) + "}"
    items = (f"[{lua_string(key)}] = {lua_literal(item)}" for key, item in value.items())
    return "{" + ", ".join(items) + "}"


def argocd_health(obj: dict[str, Any], script: Path = HEALTH) -> tuple[str, str]:
    """Run the health script on `obj` as Argo CD does; (status, message)."""
    lua = shutil.which(LUA)
    if lua is None:
        pytest.fail(f"{LUA} is not installed: `make test-tools` installs it (Debian's lua5.1)")
    program = "\n".join(
        [
            f"obj = {lua_literal(obj)}",
            f"local check = assert(loadfile({lua_string(str(script))}))",
            "local hs = check()",
            'io.write(hs.status, "\\n", hs.message, "\\n")',
        ]
    )
    result = subprocess.run(
        [lua, "-"], input=program, capture_output=True, text=True, check=False, timeout=30
    )
    assert result.returncode == 0, result.stderr
    status, message = result.stdout.rstrip("\n").split("\n", 1)
    return status, message


def service(generation: int = 3, status: dict[str, Any] | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "llmfleet.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "chat", "namespace": "ml", "generation": generation},
        "spec": {"model": {"name": "Qwen/Qwen2.5-7B-Instruct"}},
    }
    if status is not None:
        obj["status"] = status
    return obj


def cond(
    kind: str, state: str, reason: str, message: str, generation: int | None = 3
) -> dict[str, Any]:
    found = {"type": kind, "status": state, "reason": reason, "message": message}
    if generation is not None:
        found["observedGeneration"] = generation
    return found


SERVING = cond("Ready", "True", "Serving", "All pools serve: unified 2/2 serving.")
NOT_DEGRADED = cond("Degraded", "False", "AsExpected", "No problems seen.")
STABLE = cond("Progressing", "False", "Stable", "Every pool runs its target (unified 2/2).")


def status(*conditions: dict[str, Any], observed: int | None = 3, **extra: Any) -> dict[str, Any]:
    found: dict[str, Any] = {"conditions": list(conditions), **extra}
    if observed is not None:
        found["observedGeneration"] = observed
    return found


CASES = [
    pytest.param(
        service(),
        ("Progressing", "Waiting for the llmfleet operator to report status"),
        id="just applied, no status",
    ),
    pytest.param(
        service(status=status(observed=None)),
        ("Progressing", "Waiting for the llmfleet operator to report status"),
        id="status without conditions",
    ),
    pytest.param(
        service(status=status(SERVING, STABLE, NOT_DEGRADED)),
        ("Healthy", "Serving: All pools serve: unified 2/2 serving."),
        id="serving",
    ),
    pytest.param(
        service(
            status=status(
                SERVING,
                cond("Progressing", "True", "Scaling", "Pools settling: unified (2/3)."),
                NOT_DEGRADED,
                cond("ScalingLimited", "True", "GPUBudget", "GPU budget 2 (1 GPU per pod)."),
            )
        ),
        ("Healthy", "Serving: All pools serve: unified 2/2 serving."),
        id="serving while scaling, limited by the GPU budget",
    ),
    pytest.param(
        service(
            status=status(
                cond("Ready", "False", "PodsStarting", "Waiting for engine pods to load."),
                NOT_DEGRADED,
            )
        ),
        ("Progressing", "PodsStarting: Waiting for engine pods to load."),
        id="pods starting",
    ),
    pytest.param(
        service(
            status=status(
                cond("Ready", "False", "NoServingReplicas", "No pod serves in decode."),
                NOT_DEGRADED,
            )
        ),
        ("Progressing", "NoServingReplicas: No pod serves in decode."),
        id="no serving replicas yet",
    ),
    pytest.param(
        service(
            status=status(
                cond("Ready", "False", "ScaledToZero", "Scaled to zero: unified (replicas 0)."),
                NOT_DEGRADED,
            )
        ),
        ("Suspended", "ScaledToZero: Scaled to zero: unified (replicas 0)."),
        id="scaled to zero",
    ),
    pytest.param(
        service(
            status=status(
                cond("Ready", "False", "InsufficientGPU", "2 pod(s) need 1 x H100 GPU each."),
                cond("Degraded", "True", "InsufficientGPU", "2 pod(s) need 1 x H100 GPU each."),
            )
        ),
        ("Degraded", "InsufficientGPU: 2 pod(s) need 1 x H100 GPU each."),
        id="pods unschedulable",
    ),
    pytest.param(
        service(
            status=status(
                cond("Ready", "False", "InvalidSpec", "Deployment chat-unified: 422 Invalid"),
                cond("Degraded", "True", "InvalidSpec", "Deployment chat-unified: 422 Invalid"),
            )
        ),
        ("Degraded", "InvalidSpec: Deployment chat-unified: 422 Invalid"),
        id="the API server refuses a child",
    ),
    pytest.param(
        # The operator's own check of a spec admission let through writes conditions without
        # an observedGeneration (operator/llmfleet/operator/reconcile.py).
        service(
            status=status(
                cond("Ready", "False", "InvalidSpec", "spec is invalid: …", generation=None),
                cond("Degraded", "True", "InvalidSpec", "spec is invalid: …", generation=None),
                observed=2,
            )
        ),
        ("Degraded", "InvalidSpec: spec is invalid: …"),
        id="invalid spec without a generation",
    ),
    pytest.param(
        service(
            status=status(
                cond("Ready", "False", "InsufficientGPU", "no GPU", generation=2),
                cond("Degraded", "True", "InsufficientGPU", "no GPU", generation=2),
                observed=2,
            )
        ),
        (
            "Progressing",
            "Waiting for the operator to act on generation 3 (status describes generation 2)",
        ),
        id="degraded before the latest edit: not judged yet",
    ),
    pytest.param(
        service(status=status(SERVING, NOT_DEGRADED, observed=2)),
        (
            "Progressing",
            "Waiting for the operator to act on generation 3 (status describes generation 2)",
        ),
        id="serving the previous spec",
    ),
    pytest.param(
        service(status=status(SERVING, NOT_DEGRADED, observed=None)),
        (
            "Progressing",
            "Waiting for the operator to act on generation 3 (status describes no generation yet)",
        ),
        id="conditions without observedGeneration",
    ),
    pytest.param(
        service(
            status=status(
                SERVING,
                NOT_DEGRADED,
                cond("CanaryInProgress", "True", "Analysing", "step 1 of 3 at 25%"),
                canary={"phase": "Progressing", "step": 1, "weight": 25},
            )
        ),
        ("Progressing", "Analysing: step 1 of 3 at 25%"),
        id="canary rolling out",
    ),
    pytest.param(
        service(
            status=status(
                SERVING,
                NOT_DEGRADED,
                cond("CanaryInProgress", "True", "Paused", "paused by llmfleet.dev/rollout-pause"),
                canary={"phase": "Paused", "step": 2, "weight": 50},
            )
        ),
        ("Suspended", "Canary paused at step 2, weight 50%"),
        id="canary paused",
    ),
    pytest.param(
        service(
            status=status(
                SERVING,
                cond("Degraded", "True", "CanaryRolledBack", "ITL p95 81 ms > 50 ms (stable 42)"),
                canary={"phase": "RolledBack", "step": 0, "weight": 0},
            )
        ),
        ("Degraded", "CanaryRolledBack: ITL p95 81 ms > 50 ms (stable 42)"),
        id="canary rolled back, stable still serving",
    ),
]


@pytest.mark.parametrize(("obj", "expected"), CASES)
def test_argocd_health(obj: dict[str, Any], expected: tuple[str, str]) -> None:
    assert argocd_health(obj) == expected


def test_a_broken_script_fails_the_run(tmp_path: Path) -> None:
    """The harness reports the interpreter's error rather than a status it made up."""
    broken = tmp_path / "health.lua"
    broken.write_text(HEALTH.read_text().replace("return health(obj)", "return health(obj.x.y)"))
    with pytest.raises(AssertionError, match="attempt to index"):
        argocd_health(service(), broken)


def test_the_argocd_cm_snippet_carries_the_same_script() -> None:
    values = yaml.safe_load((FILES / "argocd" / "argocd-cm.yaml").read_text())
    cm = values["configs"]["cm"]
    assert set(cm) == {"resource.customizations.health.llmfleet.dev_InferenceService"}
    assert cm["resource.customizations.health.llmfleet.dev_InferenceService"] == (
        HEALTH.read_text()
    )


def test_the_script_names_only_conditions_and_phases_the_api_has() -> None:
    """The condition types and canary phase the script reads exist in the API's models."""
    api = (REPO / "crds" / "llmfleet" / "crds" / "inference_service.py").read_text()
    script = HEALTH.read_text()
    for kind in re.findall(r'condition\(status, "(\w+)"\)', script):
        assert kind in api, kind
    assert 'PAUSED = "Paused"' in api
    operator = (REPO / "operator" / "llmfleet" / "operator" / "conditions.py").read_text()
    assert '"ScaledToZero"' in operator
