"""Load levels and plans: rates, burstiness, step phases, argument parsing."""
from __future__ import annotations

import numpy as np
import pytest

from kvmap.loadgen.schedule import Level, Phase, make_plan, parse_levels, parse_steps
from kvmap.workloads.spec import WorkloadRequest


def _requests(n, arrival=None):
    return [WorkloadRequest(f"r{i}", "p", 4, arrival_s=arrival and arrival[i]) for i in range(n)]


def test_open_loop_rate_matches_vllm_rescaling():
    plan = make_plan(_requests(50), Level(rate_per_s=10.0), seed=1)
    offsets = np.array(plan.offsets_s)
    assert plan.concurrency is None and np.all(np.diff(offsets) >= 0)
    assert offsets[-1] == pytest.approx(50 / 10.0)        # last arrival at n / R
    assert make_plan(_requests(50), Level(rate_per_s=10.0), seed=1).offsets_s == plan.offsets_s


def test_burstiness_changes_the_spread():
    def cv(b):
        gaps = np.diff(make_plan(_requests(2000), Level(rate_per_s=5, burstiness=b),
                                 seed=0).offsets_s)
        return gaps.std() / gaps.mean()
    assert cv(0.25) > 1.5 > cv(1.0) > 0.8 > cv(16.0)


def test_closed_loop_and_own_arrivals():
    plan = make_plan(_requests(3), Level(concurrency=2))
    assert plan.offsets_s is None and plan.concurrency == 2
    own = make_plan(_requests(3, [0.0, 0.5, 2.0]), Level())
    assert own.offsets_s == (0.0, 0.5, 2.0)
    with pytest.raises(ValueError, match="closed loop"):
        make_plan(_requests(3), Level())


def test_step_phases_are_contiguous():
    level = Level(phases=parse_steps("2@5s,10@2s,2@5s"))
    assert level.num_requests_for(None) == 10 + 20 + 10
    plan = make_plan(_requests(40), level, seed=0)
    offsets, phases = np.array(plan.offsets_s), np.array(plan.phases)
    assert list(np.bincount(phases)) == [10, 20, 10]
    assert offsets[phases == 0].max() <= 5.0 + 1e-9
    assert 5.0 < offsets[phases == 1].min() and offsets[phases == 1].max() <= 7.0 + 1e-9
    assert offsets[phases == 2].max() == pytest.approx(12.0)


def test_parsing_and_validation():
    assert parse_levels("1, 2.5,inf", "rate") == [1.0, 2.5, float("inf")]
    assert parse_levels("1,4", "concurrency") == [1, 4]
    assert parse_steps("1@500ms,3@1m") == (Phase(1.0, 0.5), Phase(3.0, 60.0))
    assert Level(rate_per_s=2, burstiness=0.5).name == "rate=2,burstiness=0.5"
    for bad, kind in (("x", "rate"), ("1.5", "concurrency")):
        with pytest.raises(ValueError, match=repr(bad)):
            parse_levels(bad, kind)
    with pytest.raises(ValueError, match="RATE@DURATION"):
        parse_steps("6/20s")
    with pytest.raises(ValueError, match="only one"):
        Level(rate_per_s=1, concurrency=2)
    with pytest.raises(ValueError, match="concurrency"):
        Level(concurrency=0)
    with pytest.raises(ValueError, match="burstiness"):
        Level(rate_per_s=1, burstiness=0)
