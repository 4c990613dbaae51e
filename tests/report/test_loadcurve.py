"""Load curves and SLA capacity on hand-made sweeps with known answers (conftest.SWEEP)."""
from __future__ import annotations

import pytest

from kvmap.report.analysis import analyze
from kvmap.report.configs import summarize
from kvmap.report.loadcurve import LoadPoint, sla_capacity
from kvmap.report.loader import load_run
from tests.report.conftest import SWEEP_SLO, sweep_cells, write_run

SLO = {"ttft_p99_s": 1.0, "tbt_p99_s": 0.1}


def point(value, ttft, tbt, ok=True):
    return LoadPoint(f"closed:{value:g}", "closed", value, f"c{value:g}", ok,
                     measured={"ttft_p99_s": ttft, "tbt_p99_s": tbt} if ok else {})


def test_capacity_is_interpolated_at_the_first_key_to_cross():
    # TTFT crosses between 16 and 64 at 16 + (1 - .6) / (1.4 - .6) * 48 = 40; TBT would
    # cross later (r .6 -> 1.2: at 16 + .4/.6*48 = 48): the first crossing counts
    cap = sla_capacity([point(4, .3, .04), point(16, .6, .06), point(64, 1.4, .12)], SLO)
    assert cap.status == "interpolated" and cap.value == pytest.approx(40.0)
    assert "40.0 concurrent" in cap.describe()


def test_below_the_lowest_and_above_the_top_level():
    below = sla_capacity([point(4, 1.2, .05), point(16, 2.0, .06)], SLO)
    assert below.status == "below" and below.value is None
    assert below.describe() == "below the lowest level (4 concurrent)"
    top = sla_capacity([point(4, .2, .05), point(16, .4, .07), point(64, .9, .095)], SLO)
    assert top.status == "top" and top.value == 64.0
    assert top.describe() == "≥ top level (64 concurrent)"
    assert below.sort_value < top.sort_value


def test_a_failed_level_is_a_gap_not_a_crash():
    cap = sla_capacity([point(4, .3, .04), point(16, 0, 0, ok=False), point(64, 1.4, .085)],
                       SLO)
    # interpolated across the gap: 4 + (1 - .3) / (1.4 - .3) * 60
    assert cap.value == pytest.approx(4 + 0.7 / 1.1 * 60)
    assert cap.gaps == ("closed:16",)
    assert sla_capacity([point(4, 0, 0, ok=False)], SLO).status == "unmeasured"
    assert sla_capacity([point(4, .3, .04)], {}).status == "unmeasured"


def test_summaries_of_a_stored_sweep(sweep_run):
    a = analyze(load_run(sweep_run))
    caps = {c.name: c.capacity for c in a.configs}
    assert caps["bf16"].value == pytest.approx(10.0)
    assert caps["int8"].value == pytest.approx(40.0)
    assert caps["int4"].status == "top" and caps["snapkv(budget=0.25)"].status == "below"
    # every request alike: the bootstrap intervals have no width, so neither has capacity
    assert caps["int8"].ci == pytest.approx((40.0, 40.0))
    int8 = next(c for c in a.configs if c.name == "int8")
    assert [p.label for p in int8.curves["chat"]] == ["closed:4", "closed:16", "closed:64"]
    assert int8.tbt_p99_s == pytest.approx(0.085)           # the top level's figures
    # the SLA is read at the highest level within it (16 for int8), not at the top
    assert int8.slo_measured["ttft_p99_s"] == pytest.approx(0.6)
    assert int8.primary.concurrency_max == 64.0


def test_a_failed_level_in_a_stored_run(tmp_path):
    run = write_run(tmp_path / "r", sweep_cells(["bf16", "int8"], failed={"int8": (16.0,)}),
                    SWEEP_SLO)
    a = analyze(load_run(run))
    int8 = next(c for c in a.configs if c.name == "int8")
    assert [p.ok for p in int8.curves["chat"]] == [True, False, True]
    assert int8.capacity.value == pytest.approx(4 + 0.7 / 1.1 * 60)
    assert int8.capacity.gaps == ("closed:16",)
    assert a.recommendation.choice == "int8"


def test_cells_without_a_load_are_single_level_workloads():
    cells = [record for record, _ in sweep_cells(["bf16"])][:1]
    cells[0].load = None
    (s,) = summarize(cells, {}, SLO)
    assert s.capacity is None and not s.curves


def test_a_bare_tbt_key_is_read_per_request_at_every_level(tmp_path):
    # each request's worst gap is its TBT: the P99 of requests and its interval agree
    run = write_run(tmp_path / "r", sweep_cells(["int8"]), {"tbt_s": 0.1})
    (int8,) = analyze(load_run(run)).configs
    top = int8.curves["chat"][-1]
    assert top.measured["tbt_s"] == pytest.approx(0.085)
    assert top.measured_ci["tbt_s"] == pytest.approx((0.085, 0.085))
    assert int8.capacity.status == "top"


def test_the_table_shows_goodput_on_the_headline_level_of_a_sweep(sweep_run):
    """The headline level's row is found by identity with the summary's metrics: one view
    per cell, so the top level that ran shows the configuration's goodput."""
    from kvmap.report.table import metric_rows
    a = analyze(load_run(sweep_run))
    headers, rows = metric_rows(a.configs)
    col = headers.index("goodput tok/s") - 1            # cells start after "config"
    int8 = next(c for c in a.configs if c.name == "int8")
    assert int8.goodput_tok_s is not None
    mine = [r.cells for r in rows if r.config == "int8"]
    assert [r[col] for r in mine] == ["-", "-", f"{int8.goodput_tok_s:.1f}"]
