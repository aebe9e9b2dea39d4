"""What holds for every input, generated: bounds, the budget, fail-static, a reason each time,
and no hidden state (the same call twice gives the same decision)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from llmfleet.autoscaler import PolicyState, PoolInputs, PoolPods, PoolState, decide
from tests.autoscaler.builders import PROFILE, T0, at, inputs, signals, spec


@st.composite
def _pool_spec(draw: st.DrawFn) -> dict[str, Any]:
    minimum = draw(st.integers(0, 4))
    replicas = draw(st.integers(minimum, minimum + 4))
    maximum = draw(st.integers(max(replicas, 1), 30))
    return {"replicas": replicas, "minReplicas": minimum, "maxReplicas": maximum}


@st.composite
def _pool(draw: st.DrawFn) -> PoolInputs:
    load = None
    if draw(st.booleans()):
        load = signals(
            draw(st.floats(0, 300)),
            prompt=draw(st.floats(1, 16_000)),
            output=draw(st.floats(1, 4_000)),
            seconds=-draw(st.floats(0, 120)),
            running=draw(st.floats(0, 2_000)),
            waiting=draw(st.floats(0, 500)),
            kv_cache_usage=draw(st.none() | st.floats(0, 1)),
            ttft_p95_ms=draw(st.none() | st.floats(1, 10_000)),
            itl_p95_ms=draw(st.none() | st.floats(1, 1_000)),
        )
    active = draw(st.integers(0, 40))
    starting = draw(st.integers(0, active))
    return PoolInputs(
        pods=PoolPods(
            active=active,
            spares=draw(st.integers(0, 3)),
            ready=active - starting,
            starting=starting,
            unschedulable=draw(st.integers(0, 2)),
        ),
        signals=load,
        profile=draw(st.sampled_from([PROFILE, None])),
    )


@st.composite
def _state(draw: st.DrawFn) -> PoolState:
    if not draw(st.booleans()):
        return PoolState()
    return PoolState(
        updated_at=at(-draw(st.floats(1, 600))),
        short_rate=draw(st.floats(0, 300)),
        long_rate=draw(st.floats(0, 300)),
        correction=draw(st.floats(0.5, 1.0)),
        low_since=draw(st.none() | st.builds(at, st.floats(-1_000, 0))),
        low_peak=draw(st.integers(0, 10)),
    )


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_invariants(data: st.DataObject) -> None:
    mode = data.draw(st.sampled_from(["Unified", "Disaggregated"]))
    names = ["unified"] if mode == "Unified" else ["prefill", "decode"]
    pool_specs = {name: data.draw(_pool_spec()) for name in names}
    gpus = data.draw(st.integers(1, 8))
    # Admission refuses a budget below the spec's replicas (which cover minReplicas too), and
    # below one pod's GPUs.
    least_budget = max(gpus, gpus * sum(pool["replicas"] for pool in pool_specs.values()))
    service = spec(
        mode=mode,
        pools=pool_specs,
        warm_spares=data.draw(st.integers(0, 3)),
        gpu_budget=data.draw(st.none() | st.integers(least_budget, 400)),
        gpus_per_pod=gpus,
        window=data.draw(st.integers(0, 600)),
    )
    pools = {name: data.draw(_pool()) for name in names}
    given_inputs = inputs(service, **pools)
    state = PolicyState({name: data.draw(_state()) for name in names})

    decision = decide(given_inputs, state, T0)

    assert decision == decide(given_inputs, state, T0)
    held = {
        name
        for name, pool in pools.items()
        if pool.signals is None or (T0 - pool.signals.observed_at).total_seconds() > 60
    }
    for name, pool in pools.items():
        made = decision.pools[name]
        assert made.reason
        if name in held:
            assert (made.active, made.spares) == (pool.pods.active, pool.pods.spares)
            assert "metrics" in made.reason
            continue
        limits = pool_specs[name]
        assert made.active <= limits["maxReplicas"]
        if not pool.pods.unschedulable:
            assert made.active >= limits["minReplicas"]
    budget = service.autoscaling.gpu_budget
    floor = sum(
        pools[n].pods.active + pools[n].pods.spares if n in held else pool_specs[n]["minReplicas"]
        for n in names
    )
    if budget is not None and floor * gpus <= budget:
        used = sum((p.active + p.spares) * gpus for p in decision.pools.values())
        assert used <= budget, decision
