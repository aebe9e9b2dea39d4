"""The kopf registry the operator runs: its per-service daemon puts no finalizer on services
(`handlers._without_finalizer`, which reaches into kopf's registry: this is where a kopf upgrade
that moves it shows first; `tests/cluster/test_operator.py` checks the objects themselves)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import kopf

from llmfleet.crds import GROUP, PLURAL, VERSION
from llmfleet.operator.handlers import build_registry
from llmfleet.operator.metrics import OperatorMetrics
from llmfleet.operator.reconcile import Reconciler
from llmfleet.operator.watched import Watched


def _spawning(registry: kopf.OperatorRegistry) -> list[Any]:
    return list(registry._spawning._handlers)


def test_kopf_daemons_require_a_finalizer_unless_the_operator_drops_it() -> None:
    plain = kopf.OperatorRegistry()

    @kopf.daemon(GROUP, VERSION, PLURAL, registry=plain)
    async def loop(**_: Any) -> None:
        """A daemon as kopf registers it."""

    assert [h.requires_finalizer for h in _spawning(plain)] == [True]

    reconciler = cast(Reconciler, SimpleNamespace(metrics=OperatorMetrics()))
    ours = build_registry(reconciler, cast(Watched, object()), workers=1)
    handlers = _spawning(ours)
    assert handlers, "the operator registers its per-service daemon"
    assert [h.requires_finalizer for h in handlers] == [False] * len(handlers)
