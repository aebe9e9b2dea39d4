"""The GPU budget at run time (pure): `spec.autoscaling.gpuBudget` caps the GPUs a service's
pods hold, spares included, whatever asks for more.

Admission refuses a spec whose own replicas exceed the budget; what only shows at run time —
warm spares on top, an autoscaler decision — is cut here: spares first (they are insurance),
one at a time from the pool with the most, then active pods from the pool with the most. Pods
still draining after a scale-down hold their GPUs until they go, so they count as held, and so
do the pods of pools a topology change retires (`retiring`): they serve until the new pools do,
so the new pools start within what the budget has left (with no room at all, a new pool gets no
pod, the old pools drain first and the switch breaks before it makes). The operator's own
rollouts surge a pod only where the budget has room for it (`surge`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class PoolTarget:
    active: int
    spares: int
    source: str
    """Where `active` came from: the spec, or the autoscaler's decision."""
    wanted_active: int
    """`active` before the GPU budget cut it (the spec's or the autoscaler's number)."""
    wanted_spares: int
    """`spares` before the GPU budget cut it."""
    draining: int = 0
    """Pods demoted earlier and still draining: they hold GPUs on top of active and spares."""

    @property
    def cut(self) -> bool:
        return (self.active, self.spares) != (self.wanted_active, self.wanted_spares)


def gpus_held(targets: dict[str, PoolTarget], gpus_per_pod: int, retiring: int = 0) -> int:
    """GPUs held by the pools' pods and by `retiring` pods of pools the spec no longer has."""
    pods = sum(target.active + target.spares + target.draining for target in targets.values())
    return (pods + retiring) * gpus_per_pod


def fit(
    targets: dict[str, PoolTarget], gpus_per_pod: int, budget: int | None, retiring: int = 0
) -> dict[str, PoolTarget]:
    """The targets cut to the budget: spares go first, then active pods, each time from the
    pool that has the most (the first such pool in serving order on a tie); `retiring` pods of
    pools the spec no longer has hold their GPUs meanwhile."""
    result = dict(targets)
    if budget is None:
        return result
    for field in ("spares", "active"):
        while gpus_held(result, gpus_per_pod, retiring) > budget:
            counts = {pool: getattr(target, field) for pool, target in result.items()}
            pool = max(counts, key=lambda name: counts[name])
            if counts[pool] == 0:
                break
            result[pool] = replace(result[pool], **{field: counts[pool] - 1})
    return result


def surge(pods: int, pools: int, gpus_per_pod: int, budget: int | None) -> int:
    """Extra pods a rolling update may start per pool (1, or 0 once every pool surging at once
    would pass the budget), given the `pods` all pools run now."""
    if budget is None or (pods + pools) * gpus_per_pod <= budget:
        return 1
    return 0


def limit_message(
    targets: dict[str, PoolTarget], gpus_per_pod: int, budget: int, retiring: int = 0
) -> str:
    """The figures of a cut, e.g. `GPU budget 3 (1 GPU per pod): the pools would need 4 GPUs
    and hold 3. unified runs 2 active + 1 spare of 2 + 2 wanted (spec).`"""
    runs = "; ".join(
        f"{pool} runs {t.active} active + {t.spares} spare"
        + (f" (+ {t.draining} draining)" if t.draining else "")
        + f" of {t.wanted_active} + {t.wanted_spares} wanted ({t.source})"
        for pool, t in targets.items()
    )
    if retiring:
        runs += (
            f"; {retiring} pod(s) of pools the spec no longer has hold their GPUs until the "
            "new pools serve"
        )
    held = gpus_held(targets, gpus_per_pod, retiring)
    wanted = (
        sum(
            (t.wanted_active + t.wanted_spares + t.draining) * gpus_per_pod
            for t in targets.values()
        )
        + retiring * gpus_per_pod
    )
    return (
        f"GPU budget {budget} ({gpus_per_pod} GPU per pod): the pools would need {wanted} GPUs "
        f"and hold {held}. {runs}."
    )
