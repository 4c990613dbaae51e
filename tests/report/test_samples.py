"""Accuracy with its power: Wilson intervals, the negative-sample rate (joined by
sample_id), paired drops and output-length inflation, on hand-made samples."""
from __future__ import annotations

import pytest

from kvmap.report.analysis import analyze
from kvmap.report.loader import load_run
from kvmap.report.samples import accuracy_drop, inflation, negative_rate, wilson
from kvmap.report.table import metric_rows
from tests.report.conftest import _record, sweep_cells, write_run


def test_wilson_interval_known_values():
    assert wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    lo, hi = wilson(38, 40)
    assert lo == pytest.approx(0.8347, abs=1e-3) and hi == pytest.approx(0.9862, abs=1e-3)
    assert wilson(0, 0) is None


def samples(correct: dict) -> list[dict]:
    return [{"sample_id": sid, "correct": ok, "context_tokens": 1024, "depth": 0.5}
            for sid, ok in correct.items()]


def test_negative_rate_joins_by_sample_id():
    base = samples({"a": True, "b": True, "c": False, "d": True, "e": True})
    # another order, one sample the baseline lacks, one it has that this lacks ("e")
    mine = samples({"d": False, "c": True, "b": False, "a": True, "z": False})
    rate = negative_rate(mine, base)
    assert rate.num_samples == 4                   # a, b, c, d joined
    assert rate.value == pytest.approx(0.5)        # b and d: right in the baseline only
    assert rate.ci == pytest.approx(wilson(2, 4))
    # the average hides it: 2 of 4 right on each side minus c's gain -> a 25-point drop
    assert accuracy_drop(mine, base)["mean"] == pytest.approx(25.0)
    # old runs: one float per sample, paired by position
    assert negative_rate([1.0, 0.0], [1.0, 1.0]).value == pytest.approx(0.5)


def gen(lengths: list[int], e2e: list[float]) -> list[dict]:
    return [{"sample_id": f"g{i}", "num_output_tokens": n, "finish_reason": "stop",
             "e2e_s": t} for i, (n, t) in enumerate(zip(lengths, e2e))]


def test_length_inflation_known_answer():
    base = gen([10, 20, 30, 40], [1.0, 2.0, 3.0, 4.0])
    mine = gen([12, 24, 36, 48], [1.1, 2.3, 3.3, 4.3])        # every output 20% longer
    i = inflation(mine, base)
    assert i.mean_tokens == pytest.approx(30.0) and i.base_mean_tokens == pytest.approx(25.0)
    assert i.mean_pct == pytest.approx(20.0)
    assert i.p90_tokens == pytest.approx(44.4) and i.p90_pct == pytest.approx(20.0)
    assert i.e2e_pct == pytest.approx(10.0)
    assert i.mean_ci[0] <= 20.0 <= i.mean_ci[1]


def _task_cells(kv, model="m", correct=None, lengths=None):
    cells = []
    if correct is not None:
        per = samples(correct)
        acc = sum(correct.values()) / len(correct)
        cells.append((_record(f"{model}-{kv}-passkey", kv, "task",
                              {"accuracy": acc, "num_samples": len(per)}, task="passkey",
                              details={"per_sample": per}, task_kind="accuracy"), []))
    if lengths is not None:
        per = gen(lengths, [0.1 * n for n in lengths])
        cells.append((_record(f"{model}-{kv}-gen", kv, "task", {"mean_output_tokens": 1.0},
                              task="generation", details={"per_sample": per},
                              task_kind="generation"), []))
    for record, _ in cells:
        record.model = model
    return cells


def test_a_run_with_samples_dummy_weights_and_inflation(tmp_path):
    ids = [f"s{i}" for i in range(40)]
    base = {s: True for s in ids}
    mine = {s: i >= 4 for i, s in enumerate(ids)}                # 4 of 40 lost
    cells = (sweep_cells(["bf16", "int8"]) + sweep_cells(["bf16", "int8"], model="big")
             + _task_cells("bf16", correct=base, lengths=[20] * 10)
             + _task_cells("int8", correct=mine, lengths=[23] * 10))
    a = analyze(load_run(write_run(tmp_path / "r", cells, {"ttft_p99_s": 1.0})))
    by = {c.name: c for c in a.configs}
    t = by["m: int8"].tasks["passkey"]
    assert t.value_ci == pytest.approx(wilson(36, 40))
    assert t.negative.value == pytest.approx(0.1) and t.negative.ci == pytest.approx(wilson(4, 40))
    assert t.drop_pct == pytest.approx(10.0) and t.distinguishable is True
    assert by["m: int8"].inflation.mean_pct == pytest.approx(15.0)
    assert by["big: int8"].accuracy_na and not by["m: int8"].accuracy_na
    items = {i.item: i for i in a.checklist["m: int8"]}
    length = items["output length vs the baseline (natural stopping)"]
    assert length.status == "WARN" and "+15.0%" in length.measured
    big = {i.item: i for i in a.checklist["big: int8"]}
    assert "n/a" in big["output length vs the baseline (natural stopping)"].measured
    headers, rows = metric_rows(a.configs)
    col = headers.index("passkey")
    big_row = next(r for r in rows if r.config == "big: int8")
    m_row = next(r for r in rows if r.config == "m: int8" and r.id)
    assert big_row.cells[col - 1] == "n/a"
    assert "negative 10% [4, 23]" in m_row.cells[col - 1]
    assert "acc 90% [77, 96] (n=40)" in m_row.cells[col - 1]
    assert "length mean 23.0 (+15.0%" in m_row.cells[headers.index("generation") - 1]
    for header in ("concurrent max / mean", "KV capacity (tokens)", "weights"):
        assert header in headers
    assert m_row.cells[headers.index("concurrent max / mean") - 1] == "4 / 3.2"


def test_a_fixed_length_generation_task_is_not_a_length_task():
    from kvmap.report.samples import has_lengths
    assert has_lengths(gen([10], [1.0]))
    assert not has_lengths([{"sample_id": "g0", "num_output_tokens": 64}])   # EOS ignored
    assert not has_lengths([0.5, 1.0])
