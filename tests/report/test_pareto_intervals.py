"""Pareto fronts and the request-level bootstrap intervals."""
from __future__ import annotations

import numpy as np
import pytest

from kvmap.report.intervals import bootstrap_ci
from kvmap.report.pareto import pareto_front


def test_pareto_front_minimize_both():
    points = [(1, 5), (2, 2), (3, 3), (4, 1), (2, 2.5), (None, 0)]
    assert pareto_front(points) == [0, 1, 3]


def test_pareto_front_maximize_y_and_ties():
    points = [(100, 50), (90, 40), (120, 60), (100, 50), (130, 55)]
    # (90, 40) and (120, 60) are better on one axis each; (100, 50) twice: neither
    # dominates the other, both kept
    assert pareto_front(points, minimize_y=False) == [1, 0, 3, 2]


def test_bootstrap_ci_matches_pooled_statistics():
    rng = np.random.default_rng(0)
    groups = [list(rng.exponential(0.05, size=rng.integers(1, 20))) for _ in range(40)]
    pooled = np.concatenate(groups)
    for stat, expected in (("p50", np.percentile(pooled, 50)), ("p99", np.percentile(pooled, 99)),
                           ("mean", pooled.mean()), ("max", pooled.max())):
        ci = bootstrap_ci(groups, stat, seed=3)
        assert ci["value"] == pytest.approx(expected)
        assert ci["ci_low"] <= ci["value"] + 1e-12 or stat == "max"
        assert ci["ci_low"] <= ci["ci_high"]
    assert bootstrap_ci(groups, "p99", seed=3) == bootstrap_ci(groups, "p99", seed=3)


def test_bootstrap_ci_width_shrinks_with_more_requests():
    rng = np.random.default_rng(1)
    few = [[v] for v in rng.normal(1.0, 0.2, size=10)]
    many = [[v] for v in rng.normal(1.0, 0.2, size=1000)]
    w_few = bootstrap_ci(few, "mean")
    w_many = bootstrap_ci(many, "mean")
    assert (w_many["ci_high"] - w_many["ci_low"]) < (w_few["ci_high"] - w_few["ci_low"]) / 3
    assert w_many["ci_low"] < 1.0 < w_many["ci_high"]


def test_bootstrap_ci_edge_cases():
    assert bootstrap_ci([], "p99") is None
    assert bootstrap_ci([[2.0]], "p99") == {"value": 2.0, "ci_low": 2.0, "ci_high": 2.0}
    with pytest.raises(ValueError, match="statistic 'p200'"):
        bootstrap_ci([[1.0]], "p200")
