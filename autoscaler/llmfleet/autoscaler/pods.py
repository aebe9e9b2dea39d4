"""A pool's pods as the policy counts them (`PoolPods`), from the pods the Kubernetes API lists.

Pure: the Kubernetes layer (`kube.py`) turns API objects into `PodView`s; this module counts.

    active, spares = status.autoscaling.pools[pool] when the autoscaler has decided (clamped to
                     the pool's min/max as the operator clamps it), else the spec
    ready          = Ready pods that serve (spares and draining pods carry no load)
    starting       = pods that are not Ready, not terminating and not unschedulable
    unschedulable  = Pending pods the scheduler could not place
    ready_spares   = Ready pods out of traffic (warm spares, draining pods)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from llmfleet.autoscaler.inputs import PoolPods
from llmfleet.crds.inference_service import AutoscalingStatus, InferenceServiceSpec


@dataclass(frozen=True)
class PodView:
    pool: str
    ready: bool
    serving: bool
    """The pod's `llmfleet.dev/serving` label is "true"."""
    terminating: bool = False
    unschedulable: bool = False


def targets(
    spec: InferenceServiceSpec, decided: AutoscalingStatus | None
) -> dict[str, tuple[int, int]]:
    """(active, spares) per pool that the operator is running towards now."""
    pools = decided.pools if decided is not None else {}
    result: dict[str, tuple[int, int]] = {}
    for name, pool in spec.pools().items():
        if name in pools:
            low = pool.min_replicas or 0
            high = pool.max_replicas if pool.max_replicas is not None else 10**6
            result[name] = (min(max(pools[name].active, low), high), pools[name].spares)
        else:
            result[name] = (pool.replicas, spec.autoscaling.warm_spares)
    return result


def pool_pods(
    spec: InferenceServiceSpec, decided: AutoscalingStatus | None, pods: Iterable[PodView]
) -> dict[str, PoolPods]:
    live = [pod for pod in pods if not pod.terminating]
    result: dict[str, PoolPods] = {}
    for name, (active, spares) in targets(spec, decided).items():
        mine = [pod for pod in live if pod.pool == name]
        result[name] = PoolPods(
            active=active,
            spares=spares,
            ready=sum(1 for pod in mine if pod.ready and pod.serving),
            starting=sum(1 for pod in mine if not pod.ready and not pod.unschedulable),
            unschedulable=sum(1 for pod in mine if pod.unschedulable),
            ready_spares=sum(1 for pod in mine if pod.ready and not pod.serving),
        )
    return result
