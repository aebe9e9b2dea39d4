"""Fitting the pools' wishes into the service's GPU budget.

Budget = GPUs per pod x (active + spares) summed over pools. When the wishes exceed it, spares
go first (they are insurance; active replicas serve load), then scale-ups shrink, largest first,
down to what each pool runs now (the budget never forces a pool below its current count unless
even those exceed it), then to minReplicas. Pools held fail-static are left alone.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Wish:
    active: int
    spares: int
    current: int
    """Serving replicas the pool runs towards now."""
    minimum: int
    adjustable: bool
    """False for a pool held fail-static: its counts stand."""


def _total(wishes: dict[str, Wish], gpus_per_pod: int) -> int:
    return sum((w.active + w.spares) * gpus_per_pod for w in wishes.values())


def _current_floor(wish: Wish) -> int:
    return max(min(wish.current, wish.active), wish.minimum)


def _minimum_floor(wish: Wish) -> int:
    return wish.minimum


def fit(wishes: dict[str, Wish], gpus_per_pod: int, budget: int | None) -> dict[str, Wish]:
    """The wishes trimmed into the budget (or as near as minReplicas allow)."""
    result = dict(wishes)
    if budget is None:
        return result
    # Spares first, one at a time from the pool holding the most.
    while _total(result, gpus_per_pod) > budget:
        spare_pools = [n for n, w in result.items() if w.adjustable and w.spares > 0]
        if not spare_pools:
            break
        name = max(spare_pools, key=lambda n: result[n].spares)
        result[name] = replace(result[name], spares=result[name].spares - 1)
    for floor_of in (_current_floor, _minimum_floor):
        while _total(result, gpus_per_pod) > budget:
            above = {
                n: w.active - floor_of(w)
                for n, w in result.items()
                if w.adjustable and w.active > floor_of(w)
            }
            if not above:
                break
            name = max(above, key=lambda n: above[n])
            result[name] = replace(result[name], active=result[name].active - 1)
    return result
