"""The HPA the threshold baselines scale through: its AverageValue arithmetic and `behavior`."""

from __future__ import annotations

import pytest

from llmfleet.autoscaler.sim.hpa import KUBERNETES_DEFAULT, Behaviour, Hpa, Policy, average_value
from llmfleet.autoscaler.sim.wva import WVA_HPA


@pytest.mark.parametrize(
    ("total", "target", "current", "expected"),
    [
        pytest.param(18.0, 3.0, 2, 6, id="ceil-18-over-3"),
        pytest.param(6.5, 3.0, 2, 2, id="ratio-1.08-inside-tolerance"),
        pytest.param(6.7, 3.0, 2, 3, id="ratio-1.12-outside-tolerance"),
        pytest.param(10.5, 1.0, 10, 10, id="10.5-of-10-inside-tolerance"),
        pytest.param(0.0, 3.0, 4, 0, id="nothing-in-flight"),
    ],
)
def test_average_value(total: float, target: float, current: int, expected: int) -> None:
    assert average_value(total, target, current) == expected


@pytest.mark.parametrize(
    ("current", "recommended", "expected"),
    [
        pytest.param(2, 20, 6, id="small-pool-4-pods"),
        pytest.param(10, 40, 20, id="large-pool-100-percent"),
        pytest.param(10, 12, 12, id="within-the-limits"),
        pytest.param(30, 100, 40, id="max-replicas"),
    ],
)
def test_default_scale_up_in_one_pass(current: int, recommended: int, expected: int) -> None:
    hpa = Hpa(KUBERNETES_DEFAULT, initial=current, min_replicas=1, max_replicas=40)
    assert hpa.scale(15.0, current, recommended) == expected


def test_default_scale_down_takes_the_highest_recommendation_of_300_s() -> None:
    hpa = Hpa(KUBERNETES_DEFAULT, initial=6, min_replicas=2, max_replicas=64)
    replicas = [hpa.scale(15.0 * k, 6, 1) for k in range(1, 22)]
    assert replicas[:19] == [6] * 19  # 15 s .. 285 s: the 6 it started with is in the window
    assert replicas[19] == 2  # minReplicas


def test_scale_up_stabilisation_takes_the_lowest_recommendation_of_the_window() -> None:
    hpa = Hpa(WVA_HPA, initial=2, min_replicas=1, max_replicas=64)
    replicas = [hpa.scale(15.0 * k, 2, 2 if k < 4 else 5) for k in range(1, 21)]
    assert replicas[:18] == [2] * 18  # the 2 of 45 s holds until 285 s
    assert replicas[18] == 5


def test_a_rate_policy_counts_the_changes_made_in_its_period() -> None:
    ten_per_150_s = Behaviour(0.0, (Policy("Pods", 10, 150),), 0.0, (Policy("Pods", 10, 150),))
    hpa = Hpa(ten_per_150_s, initial=2, min_replicas=1, max_replicas=64)
    assert hpa.scale(15.0, 2, 30) == 12
    assert hpa.scale(30.0, 12, 30) == 12  # 10 added in the last 150 s
    assert hpa.scale(165.0, 12, 30) == 22  # the change of 15 s has left the period
