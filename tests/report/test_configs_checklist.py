"""Summaries, SLA measurements and the checklist on a hand-made run (conftest.make_run)."""
from __future__ import annotations

import pytest

from kvmap.report.analysis import analyze
from kvmap.report.configs import is_good, measure_key, summarize
from kvmap.report.loader import load_run
from kvmap.report.constraints import Constraints


def row(ttft, times, failed=False):
    return {"ttft_s": ttft, "token_times_s": times, "failed": failed,
            "tpot_s": (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None}


def test_measure_key_reads_each_kind_of_key():
    rows = [row(0.1, [0.0, 0.1, 0.3]), row(0.3, [0.0, 0.05]), row(9.0, [0.0], failed=True)]
    assert measure_key(rows, "ttft_max_s") == pytest.approx(0.3)
    assert measure_key(rows, "tbt_max_s") == pytest.approx(0.2)       # pooled gaps
    assert measure_key(rows, "tbt_p50_s") == pytest.approx(0.1)
    assert measure_key(rows, "tbt_s") == pytest.approx(0.2, abs=0.01)  # P99 of worst gaps
    assert measure_key(rows, "ttft_mean_s") == pytest.approx(0.2)
    assert measure_key([], "ttft_p99_s") is None
    assert is_good(rows[0], {"ttft_s": 0.2, "tbt_s": 0.25})
    assert not is_good(rows[0], {"tbt_s": 0.15})
    assert not is_good(rows[2], {"ttft_s": 100})
    with pytest.raises(ValueError, match="not normalized"):
        measure_key(rows, "ttft_p99")


def test_summaries_of_the_fake_run(fake_run):
    a = analyze(load_run(fake_run))
    bf16, int8 = a.configs
    assert bf16.is_baseline and not int8.is_baseline
    assert (bf16.peak_kv_bytes, int8.peak_kv_bytes) == (40 << 20, 20 << 20)
    assert int8.tasks["passkey"].drop_pct == pytest.approx(25.0)     # 1 of 4 lost
    assert int8.tasks["ppl"].drop_pct == pytest.approx(0.5)
    assert int8.accuracy_drop_pct == pytest.approx(25.0)
    assert bf16.accuracy_drop_pct == 0.0
    assert int8.throughput_tok_s == pytest.approx(48 / 1.5)
    # TTFT 0.3 s in int8 against the SLA's 0.5 s; bf16 at 0.2 s
    assert int8.slo_measured["ttft_p99_s"] == pytest.approx(0.3)
    # the default 1% accuracy budget excludes int8 (25 points lost on passkey)
    assert a.recommendation.choice == "bf16"
    assert a.recommendation.binding_constraints == ("accuracy_drop",)


def test_checklist_items_and_statuses(fake_run):
    run = load_run(fake_run)
    a = analyze(run, Constraints(run.slo, max_accuracy_drop_pct=1.0))
    items = {n: {i.item: i for i in its} for n, its in a.checklist.items()}
    bf16, int8 = items["bf16"], items["int8"]
    assert bf16["peak KV memory with headroom under the budget"].status == "PASS"  # 40/64
    assert "62%" in bf16["peak KV memory with headroom under the budget"].measured
    assert int8["accuracy drop on ppl"].status == "PASS"
    assert int8["accuracy drop on passkey"].status == "FAIL"
    assert int8["output stability (temperature 0, alone vs in a mixed batch)"].status == "PASS"
    assert int8["operator launches per decode step vs the baseline"].status == "FAIL"  # 2.1x
    assert bf16["operator launches per decode step vs the baseline"].status == "PASS"
    storage = "storage P99 read latency below the per-token decode time"
    assert storage not in bf16                       # no tier: the item does not apply
    assert int8[storage].status == "PASS"            # 4 ms against a ~42 ms decode step
    assert bf16["P99 latency within the SLA"].status == "PASS"
    assert int8["throughput at the target latency"].status == "PASS"
    a = analyze(run, Constraints({"ttft_p99_s": 0.25}, 1.0, kv_budget_bytes=45 << 20))
    items = {n: {i.item: i for i in its} for n, its in a.checklist.items()}
    assert items["int8"]["P99 latency within the SLA"].status == "FAIL"
    assert items["int8"]["throughput at the target latency"].status == "FAIL"
    assert items["bf16"]["peak KV memory with headroom under the budget"].status == "WARN"
    assert all(i.status in ("PASS", "WARN", "FAIL") for its in a.checklist.values()
               for i in its)


def test_load_run_refuses_a_directory_that_is_not_a_run(tmp_path):
    with pytest.raises(ValueError, match="not a kvmap run directory"):
        load_run(tmp_path)


def test_a_needle_workload_counts_as_an_accuracy_task():
    from kvmap.runs.record import CellRecord

    def cell(kv, accuracy):
        return CellRecord(cell_id=f"{kv}-lc", kind="workload", model="m", dtype="bf16", kv=kv,
                          workload="lc",
                          metrics={"needle_accuracy": accuracy, "num_requests": 2})

    def rows(kv, correct):
        return [{"cell_id": f"{kv}-lc", "request_id": f"q{i}", "correct": ok,
                 "needle_depth": d, "num_prompt_tokens": 1000, "token_times_s": [0.0]}
                for i, (ok, d) in enumerate(zip(correct, (0.25, 0.75)))]

    cells = [cell("bf16", 1.0), cell("snapkv", 0.5)]
    by_cell = {"bf16-lc": rows("bf16", [True, True]), "snapkv-lc": rows("snapkv", [True, False])}
    bf16, snap = summarize(cells, by_cell)
    task = snap.tasks["lc (needle)"]
    assert task.drop_pct == pytest.approx(50.0) and snap.accuracy_drop_pct == pytest.approx(50.0)
    assert [(g["depth"], g["accuracy"]) for g in task.grid] == [(0.25, 1.0), (0.75, 0.0)]
    assert bf16.tasks["lc (needle)"].drop_pct == 0.0
