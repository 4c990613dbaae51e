"""Predicted beside measured and the verdict, on a hand-made run with known answers."""
from __future__ import annotations

from kvmap.runs.record import CellRecord

import numpy as np
import pytest

from kvmap.report.analysis import analyze
from kvmap.report.calibration import calibrate_cell, calibration, mape, pearson_r
from kvmap.report.html import render
from kvmap.report.loader import load_run
from kvmap.report.terminal import summary
from kvmap.report.verdict import classify, gpu_sentence, speed_of, verdicts
from tests.report.conftest import _record, store_run

HALF = 2.262 * np.std([-5, 5] * 5, ddof=1) / np.sqrt(10)    # t(0.975, 9) sd / sqrt(n)
GPU_LABEL = "h100-80gb: spec sheet x assumed efficiency (compute 60%, bandwidth 85%)"
# workload -> kv -> (measured tok/s, running, TBT P50 s, predicted tok/s, predicted
# running, predicted TBT P50 s, predicted codec share, GPU predicted tok/s)
CASES = {
    "s1": {"bf16": (100.0, 16, 0.10, 110.0, 16, 0.10, 0.05, 1000.0),
           "int8": (98.0, 30, 0.18, 105.0, 30, 0.17, 0.08, 1800.0),
           "int4": (70.0, 49, 0.20, 100.0, 49, 0.12, 0.50, 2600.0)},
    "long": {"bf16": (20.0, 4, 0.05, 20.0, 4, 0.05, 0.02, 300.0),
             "int8": (38.0, 8, 0.05, 36.0, 8, 0.05, 0.03, 590.0)},
}


def cell(workload: str, kv: str) -> CellRecord:
    rate, running, tbt, p_rate, p_running, p_tbt, share, gpu_rate = CASES[workload][kv]
    metrics = {"output_tokens_per_s": rate, "concurrency_max": running, "num_requests": 16,
               "ttft_s": {"p50": 1.0}, "tbt_s": {"p50": tbt},
               # windows of rate -+ 5: the interval is rate -+ HALF
               "output_throughput_windows_tok_s": [rate - 5, rate + 5] * 5}
    record = _record(f"{kv}-{workload}", kv, "workload", metrics, workload=workload)
    record.env = {"load_avg_1m_end": 1.0, "hardware": {"machine_class": "x86-avx512"}}
    record.prediction = {
        "hardware": "cpu-this-machine: measured", "kv_costs": "measured",
        "metrics": {"output_tokens_per_s": p_rate, "concurrency_max": p_running,
                    "ttft_p50_s": 1.0, "tbt_p50_s": p_tbt},
        "time_s": {"kv_codec": 100 * share, "busy": 100.0},
        "bound_share": {"hbm": 0.7, "compute": 0.3},
        "roofline": {"weight_bytes": 540e6, "kv_capacity_bytes": 75.5e6,
                     "kv_bytes_per_token": 46080, "ridge_num_seqs": 12},
        "gpu": {"name": "h100-80gb", "hardware": GPU_LABEL,
                "metrics": {"output_tokens_per_s": gpu_rate}}}
    record.dtype = "bf16"
    return record


@pytest.fixture
def run(tmp_path):
    cells = [(cell(w, kv), []) for w in CASES for kv in CASES[w]]
    store_run(tmp_path / "run", cells, {"name": "predicted", "description": "hand-made",
                                        "slo": {"ttft_p99_s": 5.0}})
    return load_run(tmp_path / "run")


def test_mape_and_r_over_the_run(run):
    cal = calibration(run.cells)
    measured = [CASES[w][k][0] for w in CASES for k in CASES[w]]
    predicted = [CASES[w][k][3] for w in CASES for k in CASES[w]]
    assert cal.mape == pytest.approx(np.mean([abs(p - m) / m
                                              for p, m in zip(predicted, measured)]))
    assert cal.mape == pytest.approx((0.1 + 7 / 98 + 30 / 70 + 0 + 2 / 38) / 5)
    assert cal.pearson_r == pytest.approx(np.corrcoef(predicted, measured)[0, 1])
    # only int4 on s1 is off by more than 20%, and its decode step is what is off
    assert [c.cell_id for c in cal.missed] == ["int4-s1"]
    (miss,) = cal.missed
    assert miss.miss.startswith("the decode step (TBT P50): 120.0 ms predicted, 200.0 ms")
    assert "bound by hbm" in miss.miss


def test_the_estimate_and_the_simulator_share_one_calibration_line():
    cells = [cell("s1", "bf16"), cell("s1", "int8")]
    for record, (estimate_s, actual_s) in zip(cells, ((10.0, 8.0), (9.0, 12.0))):
        record.prediction["calibration"] = "perf/calibrations/x86-amx-bf16.json"
        record.estimate = {"estimate_s": estimate_s, "actual_s": actual_s}
    cal = calibration(cells)
    assert cal.estimate_mape == pytest.approx((2 / 8 + 3 / 12) / 2) and cal.num_estimated == 2
    from kvmap.report.prediction_view import fit_text
    assert fit_text(cal).startswith("calibration perf/calibrations/x86-amx-bf16.json: MAPE "
                                    "simulator throughput 9% over 2 cells")
    assert "budget estimate cell time 25% over 2 cells" in fit_text(cal)


def test_a_concurrency_miss_blames_the_memory_model():
    record = cell("s1", "int4")
    record.prediction["metrics"]["concurrency_max"] = 30
    cal = calibrate_cell(record)
    assert cal.miss == "the memory model: 30 sequences at once predicted, 49 measured"


def test_preemptions_the_model_did_not_see_blame_the_memory_model():
    record = cell("s1", "int4")
    record.metrics["num_preemptions_engine"] = 34
    record.prediction["metrics"]["num_preemptions"] = 3
    assert calibrate_cell(record).miss == (
        "the memory model: 3 preemptions predicted, 34 measured (sequences evicted and "
        "their prefill recomputed)")
    record.prediction["metrics"]["num_preemptions"] = 20       # within 2x
    assert calibrate_cell(record).miss == (
        "the cost of a preemption: 34 measured, 20 predicted, and the model charges only "
        "their recomputed prefill")
    record.metrics["num_preemptions_engine"] = 0
    record.prediction["metrics"]["num_preemptions"] = 0
    assert calibrate_cell(record).miss.startswith("the decode step (TBT P50)")


def test_fit_statistics_edge_cases():
    assert pearson_r([1.0], [2.0]) is None and pearson_r([1.0, 1.0], [1.0, 2.0]) is None
    assert pearson_r([1.0, 2.0, 3.0], [2.0, 4.0, 6.0]) == pytest.approx(1.0)
    assert mape([]) is None and mape([(110.0, 100.0), (90.0, 100.0)]) == pytest.approx(0.1)


def test_verdicts_per_deployment(run):
    found = verdicts(run.cells, run.rows_by_cell)
    s1 = {v.kv: v for v in found["s1"]}
    long = {v.kv: v for v in found["long"]}
    assert set(found) == {"s1", "long"} and set(s1) == {"int8", "int4"}
    int8 = s1["int8"]
    assert int8.kind == "capacity gain" and int8.measured_ratio == pytest.approx(0.98)
    lo, hi = (98 - HALF) / (100 + HALF), (98 + HALF) / (100 - HALF)
    ci_lo, ci_hi = int8.measured_ci
    assert ci_lo == pytest.approx(lo, rel=1e-3) and ci_hi == pytest.approx(hi, rel=1e-3)
    need = int(np.ceil(16 * (max(ci_hi - 1, 1 - ci_lo) / 0.05) ** 2))
    # its interval spans 1 and is wider than +-5%: the speed is undecided, with the
    # requests that would decide it; the bound named is the calibration table's
    assert int8.speed == "undecided" and int8.would_need == need
    assert int8.sentence == (
        "int8 is a capacity gain here (1.9x the sequences running at once); its speed is "
        f"undecided at this power (about {need} requests a cell would decide it): its "
        "predicted step time is mostly memory reads (weight- and KV-read-bound) (70%) on "
        "this machine (x86-avx512), and a decode step reads 540 MB of weights and at most "
        f"76 MB of KV; predicted 0.95x, measured 0.98x [{lo:.2f}, {hi:.2f}].")
    assert "shares the read of the weights" not in int8.sentence
    int4 = s1["int4"]
    assert int4.kind == "capacity gain, slower"
    assert "its codec's own operators take 50% of the predicted time (5% with bf16)" \
        in int4.sentence
    speed = long["int8"]
    assert speed.kind == "speed gain" and speed.sentence.startswith(
        "int8 is a speed gain here (2.0x the sequences running at once): ")
    assert "below 12 sequences each more sequence shares the read of the weights" \
        in speed.sentence
    assert gpu_sentence(int8) == f"On {GPU_LABEL}: predicted 1.80x bf16's throughput."
    # with the mean running in both records, the capacity is read on it
    mean = {r.cell_id: r for r in run.cells}
    mean["int8-s1"].metrics["concurrency_mean"] = 24.0
    mean["bf16-s1"].metrics["concurrency_mean"] = 15.0
    again = {v.kv: v for v in verdicts(list(mean.values()))["s1"]}["int8"]
    assert again.concurrency_ratio == pytest.approx(1.6)
    assert "(1.6x the sequences running on average)" in again.sentence


@pytest.mark.parametrize("ci, n, capacity, kind", [
    ((1.1, 1.5), 16, 1.0, "speed gain"), ((0.9, 1.1), 16, 2.0, "capacity gain"),
    ((0.6, 0.8), 16, 3.0, "capacity gain, slower"), ((0.6, 0.8), 16, 1.0, "slower"),
    ((0.97, 1.04), 16, 1.0, "no difference"), ((0.9, 1.3), 16, 1.0, "undecided"),
    # no interval, or a cell of one request: nothing is decided, however large the ratio
    (None, 16, 1.0, "undecided"), ((1.1, 1.3), 1, 1.0, "undecided")])
def test_classify(ci, n, capacity, kind):
    assert classify(speed_of(ci, n)[0], capacity) == kind


def test_a_verdict_from_one_request_is_undecided():
    a, b = cell("long", "int8"), cell("long", "bf16")
    a.metrics["num_requests"] = b.metrics["num_requests"] = 1
    (v,) = verdicts([a, b])["long"]
    assert v.kind == "undecided" and v.concurrency_ratio is None
    assert v.sentence.startswith("int8 is undecided here: its speed is undecided at this "
                                 "power (too few requests, or no interval)")


def test_report_shows_verdicts_and_the_table(run):
    analysis = analyze(run)
    html = render(analysis)
    assert "Is the KV saving a speed gain here?" in html
    assert "int8 is a capacity gain here (1.9x the sequences running at once)" in html
    assert "MAPE simulator throughput 13%" in html and GPU_LABEL in html
    from rich.console import Console
    console = Console(width=300, record=True)
    console.print(summary(analysis))
    text = console.export_text()
    assert "verdict, deployment s1" in text and "int4 is a capacity gain here at a speed" \
        in text and "the decode step (TBT P50)" in text


def test_a_run_without_predictions_gets_measured_verdicts_only(fake_run):
    """The conftest run: int8 at 1.5 s against bf16's 2.0 s for the same tokens (1.33x),
    the same peak running; no cell holds a prediction."""
    html = render(analyze(load_run(fake_run)))
    assert "no cell of this run holds a prediction" in html
    (v,) = verdicts(load_run(fake_run).cells)["chat"]
    assert v.kind == "speed gain" and v.predicted_ratio is None
    assert v.sentence.startswith("int8 is a speed gain here") and "predicted" not in v.sentence
