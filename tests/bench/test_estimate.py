"""The estimate before the first cell: token counts from the scenario, seconds from the
machine's rates; and the record that keeps estimate and actual side by side."""
from __future__ import annotations

import textwrap
from dataclasses import replace

import pytest

from kvmap.bench.cell_backend import CellBackend, CellResult
from kvmap.bench.estimate import Estimator, estimate_cells, estimate_run
from kvmap.bench.estimate_work import Pool, batch_work
from kvmap.runs.record import CellRecord
from kvmap.bench.runner import run_scenario
from kvmap.bench.scenario import load_scenario
from kvmap.runs.store import RunStore

RATES = {"matmul_flops": {"fp32": {"prefill": 1e11}}, "read_bandwidth_bytes_per_s": 1e10}

SCENARIO = """
    models: ["dummy:tiny"]
    engine: {kv_memory: 1MiB, block_size: 4, max_num_batched_tokens: 64}
    kv: [fp32, int8]
    workloads:
      - {name: tp, kind: synthetic, num_requests: 12, prompt_len: 32, output_len: 8,
         arrival: closed:4}
      - {name: open, kind: synthetic, num_requests: 6, prompt_len: 16, output_len: 4,
         arrival: "poisson:0.5"}
    """


@pytest.fixture
def scenario(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(SCENARIO))
    return load_scenario(path)


def test_batch_work_counts_tokens():
    w = batch_work(10, 100, 20, 5)
    assert w.prefill_tokens == 1000 and w.decode_tokens == 200
    assert w.decode_steps == 40                      # 200 tokens, 5 at a time
    assert w.decode_pairs == 200 * (100 + 10)         # each reads its prompt + half its output
    assert Pool(tokens=300, max_num_seqs=64).batch(16, 120) == 2.5   # the pool binds


def test_estimate_scales_with_the_rates_and_the_moment(scenario):
    cells = scenario.cells()
    slow = estimate_cells(cells, RATES, warm=True)
    fast = estimate_cells(cells, {**RATES, "matmul_flops": {"fp32": {"prefill": 2e11}}},
                          warm=True)
    busy = estimate_cells(cells, RATES, warm=True, slowdown=3.0)
    for a, b, c in zip(slow.cells, fast.cells, busy.cells):
        assert b.parts["prefill"] < a.parts["prefill"]         # twice the rate: faster
        if a.family == "tp":                                   # a busy machine: slower
            assert c.seconds == pytest.approx(3 * a.seconds)  # (an open loop's schedule not)
    # probes once per configuration: the first workload cell of each KV spec
    assert [("probes" in c.parts) for c in slow.cells] == [True, False, True, False]
    # an open loop lasts at least its schedule: 6 requests at 0.5/s
    opened = [c for c in slow.cells if c.family == "open"]
    assert all(c.seconds >= 6 / 0.5 for c in opened)
    assert set(slow.by_family()) == {"tp", "open"}
    assert slow.seconds == pytest.approx(slow.run_s + sum(c.seconds for c in slow.cells))
    assert "total" in slow.lines()[-1]


def test_cold_cells_pay_the_start_and_the_load(scenario):
    cells = scenario.cells()
    warm, cold = (estimate_cells(cells, RATES, warm=w) for w in (True, False))
    for a, b in zip(warm.cells, cold.cells):
        assert b.parts["start"] > a.parts["start"] and b.parts["build"] == a.parts["build"]


def test_fixed_costs_do_not_follow_the_compute_rate(scenario):
    """The speed is counted once, in the compute terms: a machine whose products run ten
    times as fast forks, builds and probes in the same measured seconds."""
    cells = scenario.cells()
    slow = estimate_cells(cells, RATES)
    fast = estimate_cells(cells, {"matmul_flops": {"fp32": {"prefill": 1e12}},
                                  "read_bandwidth_bytes_per_s": 1e11})
    assert fast.run_s == slow.run_s
    for a, b in zip(slow.cells, fast.cells):
        assert b.parts["start"] == a.parts["start"]
        assert b.parts.get("probes") == a.parts.get("probes")
        assert b.parts["prefill"] < a.parts["prefill"]        # the products: faster


def test_bad_slowdown_is_refused():
    with pytest.raises(ValueError, match="slowdown=0"):
        Estimator(RATES, slowdown=0)


class Recorded(CellBackend):
    """Cells that 'ran' instantly: the runner times them and stores the estimate beside."""

    name = "recorded"

    def run(self, todo, store, on_fraction):
        for ordinal, cell in todo:
            on_fraction(cell, 0.0)
            yield CellResult(ordinal, cell, CellRecord.of_cell(cell, duration_s=0.1),
                             [])


def test_record_keeps_estimate_and_actual_side_by_side(scenario, tmp_path):
    est = estimate_run(scenario, Estimator(RATES))
    run_scenario(scenario, tmp_path / "run", backend=Recorded(), show_progress=False,
                 estimate=est)
    records = RunStore(tmp_path / "run").cells()
    assert len(records) == len(scenario.cells())
    for r in records:
        e = r.estimate
        assert e["estimate_s"] == pytest.approx(est.of(r.cell_id).seconds, abs=0.01)
        assert e["actual_s"] >= 0 and set(e["parts_s"]) >= {"start", "prefill", "decode"}


def test_an_unknown_task_is_guessed_and_says_so(tmp_path):
    (tmp_path / "t.py").write_text("def mine(llm, num_samples=3):\n    return {}\n")
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent("""
        models: ["dummy:tiny"]
        engine: {kv_memory: 1MiB, block_size: 4, max_num_batched_tokens: 64}
        kv: [fp32]
        tasks: [{name: mine, task: "t.py:mine", params: {num_samples: 3}}]
        """))
    est = estimate_cells(load_scenario(path).cells(), RATES)
    (cell,) = est.cells
    assert cell.work.prefill_tokens == 3 * 1024 and "not costed" in cell.to_dict()["note"]
    assert replace(cell.work, note="").note == ""
