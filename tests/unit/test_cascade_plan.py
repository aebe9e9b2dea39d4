"""Which cascade tiers a request tries (`policies/cascade_plan`), as a table."""

from __future__ import annotations

from typing import Any

import pytest

from llmfleet.crds.policy import CascadeSpec, CascadeTier
from llmfleet.gateway.policies.cascade_plan import Plan, hint_text, plan

SMALL = CascadeTier(service="small", max_prompt_tokens=100)
MEDIUM = CascadeTier(service="medium", max_prompt_tokens=1000)
SPEC = CascadeSpec(tiers=[SMALL, MEDIUM])
HEDGED = CascadeSpec(tiers=[SMALL, MEDIUM], hedge=True)


@pytest.mark.parametrize(
    ("spec", "tokens", "text", "header", "known", "expected"),
    [
        pytest.param(SPEC, 10, "hi", None, {"small", "medium"}, Plan((SMALL, MEDIUM), ()),
                     id="short-prompt-asks-every-tier"),
        pytest.param(SPEC, 500, "hi", None, {"small", "medium"},
                     Plan((MEDIUM,), (("small", "long_prompt"),)), id="long-prompt-skips-small"),
        pytest.param(SPEC, 5000, "hi", None, {"small", "medium"},
                     Plan((), (("small", "long_prompt"), ("medium", "long_prompt"))),
                     id="longer-prompt-skips-both"),
        pytest.param(SPEC, 10, "hi", None, {"medium"},
                     Plan((MEDIUM,), (("small", "unavailable"),)), id="unknown-tier-skipped"),
        pytest.param(SPEC, 10, "hi", " LARGE ", {"small", "medium"},
                     Plan((), (("small", "header"), ("medium", "header"))), id="header-large"),
        pytest.param(SPEC, 10, "hi", "cheap", {"small", "medium"}, Plan((SMALL, MEDIUM), ()),
                     id="other-header-values-ignored"),
        pytest.param(SPEC, 10, "Explain: why?", None, {"small", "medium"},
                     Plan((), (("small", "keyword"), ("medium", "keyword")), hard=True),
                     id="keyword-skips-every-tier"),
        pytest.param(SPEC, 10, "she explained it", None, {"small", "medium"},
                     Plan((SMALL, MEDIUM), ()), id="keyword-must-be-a-whole-word"),
        pytest.param(SPEC, 10, "re-analyze", None, {"small", "medium"},
                     Plan((), (("small", "keyword"), ("medium", "keyword")), hard=True),
                     id="keyword-after-punctuation"),
        pytest.param(HEDGED, 10, "please analyse", None, {"small", "medium"},
                     Plan((SMALL,), (("medium", "keyword"),), hedge=True, hard=True),
                     id="hedge-asks-first-tier-with-the-service"),
        pytest.param(HEDGED, 500, "please prove it", None, {"small", "medium"},
                     Plan((MEDIUM,), (("small", "long_prompt"),), hedge=True, hard=True),
                     id="hedge-with-first-eligible-tier"),
        pytest.param(HEDGED, 10, "please prove it", None, set(),
                     Plan((), (("small", "unavailable"), ("medium", "unavailable"))),
                     id="hedge-without-any-tier-is-no-hedge"),
        pytest.param(CascadeSpec(tiers=[SMALL], hard_keywords=[]), 10, "explain", None,
                     {"small"}, Plan((SMALL,), ()), id="no-keywords-configured"),
        pytest.param(CascadeSpec(tiers=[SMALL], hard_keywords=["c++"]), 10, "write C++ now",
                     None, {"small"}, Plan((), (("small", "keyword"),), hard=True),
                     id="keywords-are-literal-not-regex"),
    ],
)  # fmt: skip
def test_plan(
    spec: CascadeSpec,
    *,
    tokens: int,
    text: str,
    header: str | None,
    known: set[str],
    expected: Plan,
) -> None:
    decided = plan(
        spec, prompt_tokens=tokens, text=text, tier_header=header, known=known.__contains__
    )
    assert decided == expected


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param({"prompt": "p"}, "PROMPT", id="completions-use-the-prompt"),
        pytest.param(
            {"messages": [{"role": "system", "content": "explain everything"},
                          {"role": "user", "content": "first"},
                          {"role": "assistant", "content": "ok"},
                          {"role": "user", "content": "last"}]},
            "last",
            id="chat-last-user-message-only",
        ),
        pytest.param(
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                       {"type": "image_url"},
                                                       {"type": "text", "text": "b"}]}]},
            "a b",
            id="content-parts-text-only",
        ),
        pytest.param({"messages": [{"role": "system", "content": "s"}]}, "PROMPT",
                     id="no-user-message-uses-the-prompt"),
    ],
)  # fmt: skip
def test_hint_text(body: dict[str, Any], expected: str) -> None:
    assert hint_text(body, "PROMPT") == expected
