"""Promoting a warm spare on a short signal: the fast pass's rule (pure).

A warm spare is a Ready engine out of traffic; promoting it costs a label flip (about 0.3 s to
serve) and is undone by the full pass's ordinary scale-down (the stabilization window, then to
the peak need over it). So it may act on what the sizing model would wait a minute of rate
windows to see: requests queued in the pool's engines now.

Signal: `vllm:num_requests_waiting` summed over the pool (the fast pass's gauge read). An engine
queues a request only when its batch (`maxNumSeqs`) or its KV cache is full: a queue is the
direct sign that the serving pods are short, whatever the capacity model believes. The
gateway's in-flight count would be exact and a scrape fresher, but it is per gateway replica and
a second backend to ask; the gauge is as fresh as Prometheus's scrape and already read.

Rule, per pool, one spare per call:

    promote when waiting >= PolicyConfig.promote_waiting
             and ready >= active        (every pod already promoted serves: none in flight)
             and ready_spares >= 1      (a Ready spare exists to promote)
             and active < maxReplicas
    then active + 1, spares unchanged   (the operator starts the replacement spare at once)

Guard against flapping: promotion only ever adds, at most one pod per wait for the previous one
to serve, and only the full pass removes (after `scaleDownStabilizationSeconds` of lower need).
"""

from __future__ import annotations

from llmfleet.autoscaler.inputs import PolicyConfig, PoolInputs

_MAX_REPLICAS = 1000
"""The schema's bound on maxReplicas, used when a pool sets none."""


def promotion(pool: PoolInputs, max_replicas: int | None, config: PolicyConfig) -> str:
    """Why one spare of `pool` should be promoted now, or "" when none should."""
    pods, signals = pool.pods, pool.signals
    if signals is None or pods.spares < 1 or pods.ready_spares < 1:
        return ""
    if signals.waiting < config.promote_waiting:
        return ""
    if pods.ready < pods.active:
        return ""
    if pods.active >= (max_replicas if max_replicas is not None else _MAX_REPLICAS):
        return ""
    return (
        f"promote a warm spare {pods.active} -> {pods.active + 1}: {signals.waiting:.0f} "
        f"requests queued in the engines (at least {config.promote_waiting:g}), "
        f"{pods.ready} serving, {pods.ready_spares} spares ready"
    )
