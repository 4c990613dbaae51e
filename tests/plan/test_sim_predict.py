"""A bench cell's prediction: the cell's own configuration and requests simulated on given
hardware (no probe runs), stored by the runner through the predicting backend."""
from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from kvmap.bench.cell_backend import CellBackend, CellResult
from kvmap.bench.command import register
from kvmap.bench.predicting_backend import with_predictions
from kvmap.bench.scenario_parse import parse_scenario
from kvmap.plan.sim import predict as predict_mod
from kvmap.plan.sim.hardware import Hardware
from kvmap.report.command import bench_tradeoff_map
from kvmap.runs.record import CellRecord
from kvmap.plan.sim.kvcost import KVCosts
from kvmap.plan.sim.predict import CellPredictor, predict, requests_from_rows

HW = Hardware("cpu-this-machine", 2**34, 1e11, 2e10, compute_efficiency=1.0,
              bandwidth_efficiency=1.0, step_overhead_s=1e-3, layer_overhead_s=1e-5,
              gpu_memory_utilization=1.0, reserve_bytes=0, source="measured: test",
              compute_dtype="fp32")


def cell_and_record(num_kv_blocks: int = 8):
    scenario = parse_scenario({
        "name": "p", "models": ["dummy:tiny"], "kv": ["int8"],
        "engine": {"kv_memory": "1MiB", "block_size": 4, "max_num_batched_tokens": 64,
                   "max_num_seqs": 8},
        "workloads": [{"name": "tp", "kind": "synthetic", "num_requests": 6, "prompt_len": 8,
                       "output_len": 4, "arrival": "closed:6"}]}, "p.yaml")
    (cell,) = scenario.cells()
    rows = [{"request_id": f"r{i}", "num_prompt_tokens": 8, "num_output_tokens": 4,
             "scheduled_arrival_s": None, "conversation_id": None, "turn": 0}
            for i in range(6)]
    rows.append({"request_id": "bad", "failed": True, "num_prompt_tokens": None})
    record = {"cell_id": cell.cell_id, "kind": "workload", "status": "ok", "kv": "int8",
              "metrics": {"num_kv_blocks": num_kv_blocks, "kv_block_size": 4},
              "env": {"num_threads": 2, "hardware": {"fingerprint": "f00"}}}
    return cell, record, rows


def test_requests_from_rows_keep_counts_and_leave_failed_out():
    _, _, rows = cell_and_record()
    requests = requests_from_rows(rows)
    assert [(r.prompt_tokens, r.output_tokens, r.arrival_s) for r in requests] == \
        [(8, 4, None)] * 6


def test_a_cell_predicted_on_given_hardware():
    cell, record, rows = cell_and_record()
    costs = KVCosts("int8", read_s=1e-8)
    out = predict(cell, record, rows, HW, costs, gpu="h100-80gb")
    m = out["metrics"]
    assert m["output_tokens_per_s"] > 0 and out["kv_costs"] == "given"
    # the engine's pool to the block: 8 blocks of 4 tokens, a prompt of 8 tokens takes 2,
    # so 4 of the 6 requests the closed loop sends run at once
    assert m["concurrency_max"] == 4
    roof = out["roofline"]
    assert roof["kv_capacity_bytes"] == 8 * 4 * roof["kv_bytes_per_token"]
    assert out["hardware"] == "cpu-this-machine: measured: test"
    assert out["gpu"]["name"] == "h100-80gb" and "spec sheet" in out["gpu"]["hardware"]
    assert predict(cell, record, [], HW, None, gpu=None) == {
        "skipped": "no request of the cell finished with token counts"}


def test_the_kv_specs_tiers_are_simulated_as_given_and_as_presets_on_a_gpu():
    from dataclasses import replace

    from kvmap.plan.sim.hardware import TIER_PRESETS, TierHardware
    cell, record, rows = cell_and_record()
    cell = replace(cell, kv="int8 + tiers(host=1MiB, disk=4MiB)")
    given = (TierHardware("host", 2**20, bandwidth=1e8, latency_s=0.0, link="host tier"),
             TierHardware("disk", 4 * 2**20, bandwidth=5e7, latency_s=0.0, link="disk tier"))
    out = predict(cell, record, rows, HW, None, gpu="h100-80gb", tiers=given)
    assert out["approximations"] == ["the tiered store's fetch-or-recompute rule: every "
                                      "block found in a tier is fetched"]
    assert predict_mod.gpu_tiers(given) == (
        TierHardware("host", 2**20, **TIER_PRESETS["host"]), TierHardware("disk", 4 * 2**20,
                                                         **TIER_PRESETS["nvme"]))
    bare = predict(cell, record, rows, HW, None, gpu=None)
    assert "tiers of the KV spec not simulated (the pool only)" in bare["approximations"]


def test_tier_probe_moves_one_serialized_block():
    import torch

    from kvmap.kv.config import KVConfig
    from kvmap.kv.spec import KVGeometry
    from kvmap.kv.tiers.serde import encode_block
    from kvmap.plan.sim.tier_probe import measure_tier_block
    moved = measure_tier_block("host", "int8", 2, 2, 16, torch.float32, repeats=1)
    store = KVConfig.parse("int8").codec.allocate(1, KVGeometry(1, 2, 16, 16), "cpu",
                                                  torch.float32)
    assert moved["block_bytes"] == len(encode_block([store.block_to_bytes(0)] * 2))
    assert moved["read_s"] > 0 and moved["write_s"] > 0
    with pytest.raises(ValueError, match="tier 'redis': the probe measures host, disk"):
        measure_tier_block("redis", "int8", 2, 2, 16, torch.float32)


def test_predictor_skips_a_cell_of_another_machine_and_reports_errors(monkeypatch):
    cell, record, rows = cell_and_record()
    predictor = CellPredictor(gpu=None)
    monkeypatch.setattr(predictor, "_machine", lambda dtype, threads: ("ba5e", HW))
    out = predictor(cell, record, rows)
    assert out == {"skipped": "the cell ran on another machine (profile f00, this one ba5e)"}

    def broken(*args, **kwargs):
        raise ValueError("the hardware profile has no matmul_curve.fp32")
    monkeypatch.setattr(predictor, "_machine", broken)
    assert predictor(cell, record, rows) == {
        "error": "ValueError: the hardware profile has no matmul_curve.fp32"}


def test_predicting_backend_annotates_ok_workload_cells_only():
    cell, record, rows = cell_and_record()
    failed = {**record, "status": "failed"}

    class Inner(CellBackend):
        name = "fake"

        def run(self, todo, store, on_fraction):
            yield CellResult(0, cell, CellRecord.of_cell(cell, metrics=record["metrics"]), rows)
            yield CellResult(1, cell, CellRecord.of_cell(cell, status="failed"), rows)

    seen = []
    backend = with_predictions(Inner(), lambda c, r, rs: seen.append(c) or {"metrics": {}})
    out = [r.record for r in backend.run([], None, lambda c, f: None)]
    assert out[0].prediction == {"metrics": {}} and out[1].prediction is None
    assert "prediction" not in out[1].to_dict()
    assert len(seen) == 1 and backend.name == "fake"
    inner = Inner()
    assert with_predictions(inner, None) is inner


def test_bench_refuses_an_unknown_gpu_before_any_cell(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text('models: ["dummy:tiny"]\nkv: [fp32]\nworkloads:\n'
                    '  - {name: tp, kind: synthetic, num_requests: 2, prompt_len: 8, output_len: 2}\n')
    app = typer.Typer()
    app.callback()(lambda: None)
    register(app, tradeoff_map=bench_tradeoff_map, predictor=predict_mod.bench_predictor)
    result = CliRunner().invoke(app, ["bench", str(path), "--out", str(tmp_path / "r"),
                                      "--predict", "b300"])
    assert result.exit_code == 2 and "unknown GPU 'b300'" in result.output
    assert "h100-80gb" in result.output and not (tmp_path / "r").exists()


def test_the_planner_gpu_is_the_default():
    assert predict_mod.DEFAULT_GPU == "h100-80gb"
    assert CellPredictor().gpu == "h100-80gb"


@pytest.fixture(autouse=True)
def _no_probe(monkeypatch):
    """Nothing here may measure the machine."""
    from kvmap.plan.sim import machine

    def refuse(*args, **kwargs):
        raise AssertionError("a probe ran")
    monkeypatch.setattr(machine, "this_machine", refuse)
    monkeypatch.setattr(machine, "tiers", refuse)
