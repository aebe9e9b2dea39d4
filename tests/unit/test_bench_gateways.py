"""bench/_gateways.py's reading of a gateway's histograms: the loop lag and the full GC pauses
between two reads of /metrics, as the smallest bucket bound that holds them all."""

from __future__ import annotations

import sys

import pytest

from tests.unit.bench_modules import BENCH, load

sys.path.insert(0, str(BENCH))  # the module imports its neighbour `_support`
gateways = load("_gateways")


def _text(lag: dict[str, int], gc2: dict[str, int]) -> str:
    lines = [f'llmfleet_gateway_event_loop_lag_seconds_bucket{{le="{b}"}} {n}.0'
             for b, n in lag.items()]  # fmt: skip
    lines += [f'llmfleet_gateway_gc_pause_seconds_bucket{{generation="{g}",le="{b}"}} {n}.0'
              for g in ("0", "2") for b, n in gc2.items()]  # fmt: skip
    lines.append('llmfleet_gateway_gc_pause_seconds_bucket{generation="1",le="+Inf"} 99.0')
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("before", "after", "largest"),
    [
        pytest.param({"0.005": 1, "0.1": 1, "+Inf": 1}, {"0.005": 1, "0.1": 1, "+Inf": 1}, "-",
                     id="nothing-sampled-between"),
        pytest.param({"0.005": 1, "0.1": 1, "+Inf": 1}, {"0.005": 3, "0.1": 3, "+Inf": 3}, "5",
                     id="all-in-the-first-bucket"),
        pytest.param({"0.005": 1, "0.1": 1, "+Inf": 1}, {"0.005": 3, "0.1": 4, "+Inf": 4}, "100",
                     id="one-over-the-first"),
        pytest.param({"0.005": 0, "0.1": 0, "+Inf": 0}, {"0.005": 0, "0.1": 0, "+Inf": 1}, "inf",
                     id="past-the-last-bound"),
    ],
)  # fmt: skip
def test_the_largest_between_two_reads(
    before: dict[str, int], after: dict[str, int], largest: str
) -> None:
    replica = object()  # read from the given text, never from a process
    lag = (gateways.lag_buckets(replica, _text(before, {})),
           gateways.lag_buckets(replica, _text(after, {})))  # fmt: skip
    gc = (gateways.gc_buckets(replica, _text({}, before)),
          gateways.gc_buckets(replica, _text({}, after)))  # fmt: skip
    assert gateways.lag_largest(*lag) == largest
    assert gateways.lag_largest(*gc) == largest  # generation 2 only: 0 and 1 are left out


def test_own_lag_and_cpu_wait_between_two_reads() -> None:
    """The own-lag histogram is read like the lag's; a gateway without it gives "-"."""
    replica = object()
    before = 'llmfleet_gateway_event_loop_own_lag_seconds_bucket{le="0.005"} 2.0\n'
    before += 'llmfleet_gateway_event_loop_own_lag_seconds_bucket{le="+Inf"} 2.0\n'
    before += "llmfleet_gateway_event_loop_cpu_wait_seconds_total 1.25\n"
    after = before.replace("} 2.0", "} 5.0").replace("1.25", "1.5")
    own = (gateways.own_lag_buckets(replica, before), gateways.own_lag_buckets(replica, after))
    assert gateways.lag_largest(*own) == "5"
    assert gateways.cpu_wait_ms(before, after) == "250"
    old = _text({"0.005": 1, "+Inf": 1}, {})  # a gateway from before the split
    assert gateways.lag_largest(gateways.own_lag_buckets(replica, old), {}) == "-"
    assert gateways.cpu_wait_ms(old, old) == "-"
