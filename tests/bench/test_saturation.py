"""Over-saturation: a level whose queue and TTFT keep rising stops early; a steady one
does not."""
from __future__ import annotations

import numpy as np

from kvmap.bench.saturation import SaturationWatch, rising


def test_rising_needs_a_significant_slope():
    t = list(range(20))
    assert rising(t, [2 * x for x in t], 3.0)
    noise = np.random.default_rng(0).normal(0, 1, 20)
    assert not rising(t, list(5 + noise), 3.0)
    assert not rising(t, [5 - x for x in t], 3.0)


def test_a_growing_queue_stops_the_level_once():
    watch = SaturationWatch(num_requests=40)
    stops = [watch.finished(i * 0.5, 2 + i, 0.2 + 0.3 * i) for i in range(40)]
    assert any(stops) and sum(stops) == 1 and watch.stop
    assert stops.index(True) >= 9                         # not before a quarter finished
    summary = watch.summary()
    assert summary["reason"] == "over-saturated" and summary["in_system_first_last"][0] == 2


def test_a_steady_level_runs_to_its_end():
    rng = np.random.default_rng(1)
    watch = SaturationWatch(num_requests=40)
    assert not any(watch.finished(i * 0.5, 4 + rng.integers(-1, 2), 0.5 + rng.normal(0, 0.05))
                   for i in range(40))
