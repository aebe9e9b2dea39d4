"""The policy, one decision at a time: each row gives the service, what was observed and what
the policy remembers, and the counts it must choose, with the words its reason must say.

Figures per replica come from `builders.PROFILE` (see its docstring): prefill 8,000 prompt
tok/s at 1,000-token prompts, decode 64 streams, 160,000 KV tokens; r requests/s of 200 output
tokens hold 10 r streams.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from llmfleet.autoscaler import PolicyConfig, PolicyState, PoolState, ServiceInputs, decide
from tests.autoscaler.builders import T0, at, inputs, pool, signals, spec

PD = "Disaggregated"


@dataclass(frozen=True)
class Row:
    given: ServiceInputs
    expect: dict[str, tuple[int, int]]
    """Pool -> (active, spares)."""
    says: dict[str, tuple[str, ...]]
    """Pool -> phrases its reason must contain."""
    limited: bool = False
    state: PolicyState = field(default_factory=PolicyState)


ROWS = [
    pytest.param(
        # rate 24: prefill 24,000/8,000 = 3; streams 240/64 = 3.75 -> 4; KV 240 x 1,200 =
        # 288,000/160,000 = 1.8 -> 2. Needs 4, runs 2: up at once.
        Row(
            inputs(spec(), unified=pool(2, signals(24))),
            {"unified": (4, 0)},
            {"unified": ("scale up 2 -> 4", "240 concurrent streams at 64 per replica")},
        ),
        id="load-step-up-at-once",
    ),
    pytest.param(
        # rate 16: streams 160/64 = 2.5 -> 3 = what runs.
        Row(
            inputs(spec(), unified=pool(3, signals(16))),
            {"unified": (3, 0)},
            {"unified": ("steady at 3",)},
        ),
        id="load-met-steady",
    ),
    pytest.param(
        # Both averages at 10/s, sampled 10 s ago; now 40/s. short = 10 + (1 - e^-1/3) x 30 =
        # 18.50, long = 10 + (1 - e^-1/30) x 30 = 10.98: 18.50 > 1.5 x 10.98 = 16.48, a burst.
        # slope (18.50 - 10.98)/270 s = 0.0279/s^2, over 60 s: forecast 41.67/s.
        # prefill 41,671/8,000 = 5.21 -> 6 (the current rate alone would need 5);
        # decode 416.7/64 = 6.5 -> 7.
        Row(
            inputs(spec(mode=PD), prefill=pool(1, signals(40)), decode=pool(1, signals(40))),
            {"prefill": (6, 0), "decode": (7, 0)},
            {"prefill": ("scale up 1 -> 6", "burst", "forecast 41.7/s")},
            state=PolicyState(
                {
                    name: PoolState(updated_at=at(-10), short_rate=10.0, long_rate=10.0)
                    for name in ("prefill", "decode")
                }
            ),
        ),
        id="burst-forecast-adds-ahead-of-the-rate",
    ),
    pytest.param(
        # Needs 4 (as load-step-up), but the latest sample is long gone: hold 2 and 1 spare.
        Row(
            inputs(spec(warm_spares=1), unified=pool(2, None, spares=1)),
            {"unified": (2, 1)},
            {"unified": ("holding 2 active, 1 spares", "metrics missing")},
        ),
        id="missing-metrics-fail-static",
    ),
    pytest.param(
        Row(
            inputs(spec(), unified=pool(2, signals(24, seconds=-120))),
            {"unified": (2, 0)},
            {"unified": ("holding 2", "metrics stale", "120 s old, limit 60 s")},
        ),
        id="stale-metrics-fail-static",
    ),
    pytest.param(
        # histogram_quantile over no samples is NaN; a counter reset can make a rate negative.
        Row(
            inputs(spec(), unified=pool(2, signals(-3, ttft_p95_ms=float("nan")))),
            {"unified": (2, 0)},
            {"unified": ("holding 2", "metrics invalid", "request_rate = -3", "ttft_p95_ms = nan")},
        ),
        id="invalid-metrics-fail-static",
    ),
    pytest.param(
        # TTFT 3,600 ms against 1,800: the profile promised twice what the pool gives, so the
        # correction becomes 1,800/3,600 = 0.5: prefill 24,000/4,000 = 6, streams 240/32 = 7.5
        # -> 8.
        Row(
            inputs(spec(), unified=pool(4, signals(24, ttft_p95_ms=3600.0))),
            {"unified": (8, 0)},
            {"unified": ("scale up 4 -> 8", "correction 0.50")},
        ),
        id="missed-ttft-corrects-capacity-down",
    ),
    pytest.param(
        # Same latency, but 2 of the 4 pods are still starting: their capacity is on its way
        # and the latency has not caught up, so no correction and no more pods (needs 4).
        Row(
            inputs(spec(), unified=pool(4, signals(24, ttft_p95_ms=3600.0), starting=2)),
            {"unified": (4, 0)},
            {"unified": ("steady at 4", "2 pods starting count as capacity to come")},
        ),
        id="starting-pods-count-as-capacity",
    ),
    pytest.param(
        Row(
            inputs(spec(), unified=pool(2, signals(24), unschedulable=1)),
            {"unified": (2, 0)},
            {"unified": ("holding 2", "1 pods Pending unschedulable", "needs 4")},
            limited=True,
        ),
        id="unschedulable-pods-no-pile-on",
    ),
    pytest.param(
        # prefill 20,000/8,000 = 2.5 -> 3, decode 200/64 = 3.1 -> 4, + 1 spare each, 2 GPUs per
        # pod: (3+1 + 4+1) x 2 = 18 > 12. Spares go: 14 > 12. Then the largest scale-up
        # shrinks (decode +2 over prefill +1): decode 3 -> (3 + 3) x 2 = 12.
        Row(
            inputs(
                spec(mode=PD, warm_spares=1, gpu_budget=12, gpus_per_pod=2),
                prefill=pool(2, signals(20), spares=1),
                decode=pool(2, signals(20), spares=1),
            ),
            {"prefill": (3, 0), "decode": (3, 0)},
            {
                "prefill": ("GPU budget 12 reached", "1 -> 0 spares"),
                "decode": ("GPU budget 12 reached", "4 -> 3 active"),
            },
            limited=True,
        ),
        id="gpu-budget-spares-first-then-scale-up",
    ),
    pytest.param(
        # Same wishes, 18 GPUs allowed: all fit.
        Row(
            inputs(
                spec(mode=PD, warm_spares=1, gpu_budget=18, gpus_per_pod=2),
                prefill=pool(2, signals(20), spares=1),
                decode=pool(2, signals(20), spares=1),
            ),
            {"prefill": (3, 1), "decode": (4, 1)},
            {"prefill": ("1 warm spares",), "decode": ("scale up 2 -> 4",)},
        ),
        id="gpu-budget-not-reached",
    ),
    pytest.param(
        # 2,000-token prompts at 10/s: a lone prompt takes 20 + 200 = 220 ms, usable share
        # 1 - ln 20 x 220/1800 = 0.634, 6,339 tok/s per replica: 20,000/6,339 = 3.2 -> 4.
        # decode: 100 streams/64 -> 2; KV 100 x 2,200 = 220,000/160,000 = 1.4 -> 2: stays.
        Row(
            inputs(
                spec(mode=PD),
                prefill=pool(2, signals(10, prompt=2000)),
                decode=pool(2, signals(10, prompt=2000)),
            ),
            {"prefill": (4, 0), "decode": (2, 0)},
            {"prefill": ("scale up 2 -> 4", "20000 prompt tok/s"), "decode": ("steady at 2",)},
        ),
        id="pd-longer-prompts-grow-prefill-only",
    ),
    pytest.param(
        # 800-token outputs at 10/s: 10 x 800 x 50 ms = 400 streams/64 = 6.25 -> 7 decode
        # (KV 400 x 1,800 = 720,000/160,000 = 4.5 -> 5). prefill 10,000/8,000 -> 2: stays.
        Row(
            inputs(
                spec(mode=PD),
                prefill=pool(2, signals(10, output=800)),
                decode=pool(2, signals(10, output=800)),
            ),
            {"prefill": (2, 0), "decode": (7, 0)},
            {"prefill": ("steady at 2",), "decode": ("scale up 2 -> 7", "400 concurrent")},
        ),
        id="pd-longer-outputs-grow-decode-only",
    ),
    pytest.param(
        # Few streams (rate 2: 20/64 -> 1) but the engines report KV 96% full against 80%:
        # 2 ready x 0.96/0.8 = 2.4 -> 3.
        Row(
            inputs(
                spec(mode=PD),
                prefill=pool(1, signals(2)),
                decode=pool(2, signals(2, kv_cache_usage=0.96)),
            ),
            {"prefill": (1, 0), "decode": (3, 0)},
            {"decode": ("scale up 2 -> 3", "KV-cache usage 96%", "maxKvCacheUsage 80%")},
        ),
        id="pd-kv-pressure-grows-decode",
    ),
    pytest.param(
        # 4,000-token prompts, 200 out, 1/s into decode: 10 streams, KV 10 x 4,200 = 42,000;
        # with running 40 reported: 40 x 4,200 = 168,000/160,000 = 1.05 -> 2 (streams 40/64: 1).
        # prefill: a lone prompt takes 20 + 400 = 420 ms, share 1 - ln 20 x 420/1800 = 0.30,
        # 3,010 tok/s per replica: 4,000/3,010 = 1.3 -> 2.
        Row(
            inputs(
                spec(mode=PD),
                prefill=pool(1, signals(1, prompt=4000)),
                decode=pool(1, signals(1, prompt=4000, running=40.0)),
            ),
            {"prefill": (2, 0), "decode": (2, 0)},
            {"decode": ("scale up 1 -> 2", "KV demand 168000 tokens")},
        ),
        id="pd-kv-token-demand-grows-decode",
    ),
    pytest.param(
        # Needs 4 (as load-step-up), maxReplicas 3.
        Row(
            inputs(spec(pools={"unified": {"maxReplicas": 3}}), unified=pool(2, signals(24))),
            {"unified": (3, 0)},
            {"unified": ("scale up 2 -> 3", "needs 4", "capped at maxReplicas 3")},
        ),
        id="clamped-to-max-replicas",
    ),
    pytest.param(
        # maxReplicas lowered to 3 under 5 running pods: a hard limit, no window to wait.
        Row(
            inputs(spec(pools={"unified": {"maxReplicas": 3}}), unified=pool(5, signals(24))),
            {"unified": (3, 0)},
            {"unified": ("scale down 5 -> 3 at once: above maxReplicas",)},
        ),
        id="above-max-replicas-down-at-once",
    ),
    pytest.param(
        # No load needs 0; minReplicas 2 keeps 2.
        Row(
            inputs(
                spec(pools={"unified": {"replicas": 2, "minReplicas": 2}}),
                unified=pool(2, signals(0)),
            ),
            {"unified": (2, 0)},
            {"unified": ("steady at 2", "needs 0", "raised to minReplicas 2")},
        ),
        id="clamped-to-min-replicas",
    ),
    pytest.param(
        Row(
            inputs(spec(warm_spares=2), unified=pool(2, signals(24), spares=2)),
            {"unified": (4, 2)},
            {"unified": ("scale up 2 -> 4", "2 warm spares")},
        ),
        id="warm-spares-on-top",
    ),
    pytest.param(
        # 8/s on average (8,000 tok/s: 1 replica) but the busiest 15 s of the minute prefilled
        # 24,000 tok/s: 24,000/8,003 = 3.0 -> 3. decode 80 streams/64 -> 2.
        Row(
            inputs(spec(), unified=pool(1, signals(8, peak_prompt_tokens_rate=24_000.0))),
            {"unified": (3, 0)},
            {"unified": ("scale up 1 -> 3", "24000 prompt tok/s at the window's peak")},
        ),
        id="bursts-of-seconds-size-prefill-by-the-peak",
    ),
    pytest.param(
        # 8/s (8,000 tok/s) into prefill, but 18 requests of 1,000 tokens queue in its engines:
        # clearing them within the 1.8 s target adds 10,000 tok/s: 18,000/8,003 = 2.2 -> 3.
        Row(
            inputs(
                spec(mode=PD),
                prefill=pool(1, signals(8, waiting=18.0)),
                decode=pool(2, signals(8)),
            ),
            {"prefill": (3, 0), "decode": (2, 0)},
            {"prefill": ("scale up 1 -> 3", "8000 prompt tok/s + 10000 for the 18 queued")},
        ),
        id="queued-prompts-add-to-prefill",
    ),
    pytest.param(
        # A peak below the mean (a quiet last 15 s) changes nothing: rate 24 needs 4.
        Row(
            inputs(spec(), unified=pool(2, signals(24, peak_prompt_tokens_rate=5_000.0))),
            {"unified": (4, 0)},
            {"unified": ("scale up 2 -> 4",)},
        ),
        id="peak-below-the-mean-ignored",
    ),
    pytest.param(
        # No profile: H100 defaults for an 8B BF16 model. prefill 0.4 x 989 TFLOPS / 16 GFLOP
        # = 24,725 tok/s; a lone 1,000-token prompt 40 ms, share 1 - ln 20 x 40/1800 = 0.93 ->
        # capped 0.9: 22,252.5 tok/s; 50,000/22,252.5 = 2.2 -> 3. decode: 256 streams
        # (max-num-seqs), 500/256 -> 2; KV (72 - 16) GB / 131,072 B = 427,246 x 0.8:
        # 600,000/341,797 -> 2.
        Row(
            inputs(
                spec(mode=PD),
                prefill=pool(1, signals(50), profile=None),
                decode=pool(1, signals(50), profile=None),
            ),
            {"prefill": (3, 0), "decode": (2, 0)},
            {"prefill": ("H100 defaults", "22252 tok/s per replica")},
        ),
        id="no-profile-uses-gpu-defaults",
    ),
]


@pytest.mark.parametrize("row", ROWS)
def test_decision(row: Row) -> None:
    decision = decide(row.given, row.state, T0)

    assert {name: (p.active, p.spares) for name, p in decision.pools.items()} == row.expect
    for name, phrases in row.says.items():
        for phrase in phrases:
            assert phrase in decision.pools[name].reason
    assert decision.limited is row.limited
    assert bool(decision.message) is row.limited


def test_a_p99_target_plans_more_prefill_headroom() -> None:
    # 24/s into 3 prefill replicas. For a p95 target the share is 1 - ln 20 x 120/1800 = 0.800:
    # 24,000/8,003 = 3.0 -> 3. For a p99 target 1 - ln 100 x 120/1800 = 0.693: 24,000/6,930 =
    # 3.5 -> 4 (the queue's tail grows faster than its mean as the replica fills up).
    given = inputs(spec(mode=PD), prefill=pool(3, signals(24)), decode=pool(4, signals(24)))

    p95 = decide(given, PolicyState(), T0)
    p99 = decide(given, PolicyState(), T0, PolicyConfig(latency_quantile=0.99))

    assert p95.pools["prefill"].active == 3
    assert "80% utilisation for the TTFT p95 target" in p95.pools["prefill"].reason
    assert p99.pools["prefill"].active == 4
    assert "69% utilisation for the TTFT p99 target" in p99.pools["prefill"].reason


def test_status_is_what_the_operator_reads() -> None:
    given = inputs(spec(warm_spares=1), unified=pool(2, signals(24), spares=1, unschedulable=1))

    status = decide(given, PolicyState(), T0).status()

    assert status.last_decision_time == "2026-01-01T00:00:00Z"
    assert status.limited is True
    assert "unified: 1 pods Pending unschedulable" in status.message
    assert (status.pools["unified"].active, status.pools["unified"].spares) == (2, 1)
    wire = status.model_dump(by_alias=True)
    # metricsMissing* are the loop's (what Prometheus lacked), never the policy's.
    assert set(wire) == {"pools", "lastDecisionTime", "limited", "message",
                         "metricsMissingSince", "metricsMissingPools"}  # fmt: skip
    assert (wire["metricsMissingSince"], wire["metricsMissingPools"]) == (None, None)


def test_fail_static_keeps_what_the_policy_learnt() -> None:
    state = PolicyState({"unified": PoolState(updated_at=at(-30), correction=0.7)})

    decision = decide(inputs(spec(), unified=pool(2, None)), state, T0)

    assert decision.state == state
