"""The system time-series sampler on the tiny model, and its Parquet file in a run."""
from __future__ import annotations

import pytest

from kvmap.bench.drive import drive
from kvmap.runs.store import RunStore
from kvmap.bench.timeseries import (TimeSeriesSampler, snapshot, time_weighted_mean,
                                    write_timeseries)
from kvmap.workloads.spec import WorkloadRequest
from tests.conftest import make_tiny_llm


def run_closed(concurrency: int, num_requests: int = 8):
    llm = make_tiny_llm()
    requests = [WorkloadRequest(f"r{i}", "x", max_tokens=40, ignore_eos=True)
                for i in range(num_requests)]
    prompts = [[1 + (i + j) % 50 for j in range(10)] for i in range(num_requests)]
    with TimeSeriesSampler(llm.engine, period_s=0.002) as ts:
        outputs, errors, _ = drive(llm.engine, requests, prompts, concurrency)
    assert len(outputs) == num_requests and not errors
    return ts


def test_sampler_series_closed4():
    ts = run_closed(4)
    cols = ts.columns()
    t = cols["t_s"]
    assert len(t) >= 3
    assert all(b >= a for a, b in zip(t, t[1:]))                 # monotone timestamps
    assert all(10 * 2**20 < r < 64 * 2**30 for r in cols["rss_bytes"])
    assert max(cols["num_running"]) == 4                          # closed:4
    assert cols["num_running"][0] == 0 and cols["num_running"][-1] == 0
    assert all(b >= a for a, b in zip(cols["cpu_s"], cols["cpu_s"][1:]))
    summary = ts.summary()
    assert summary["kv_waste_bytes_max"] > 0                     # 4-slot blocks, odd lengths
    assert 0 < summary["kv_waste_share_mean"] < 1


def test_snapshot_waste_exact():
    llm = make_tiny_llm()
    engine = llm.engine
    from kvmap.request import SamplingParams
    engine.add_request([1] * 10, SamplingParams(max_tokens=5, ignore_eos=True))
    engine.step()                            # prefill of 10 tokens: 3 blocks of 4 slots
    snap = snapshot(engine)
    per_slot = engine.kv.bytes_per_block // engine.kv.block_size
    (req,) = engine.scheduler.running
    assert snap["num_running"] == 1
    assert snap["kv_waste_bytes"] == (len(req.block_ids) * 4 - req.num_kv_slots) * per_slot
    assert req.num_kv_slots == 10 and snap["kv_waste_bytes"] == 2 * per_slot


def test_snapshot_reads_every_tier_level():
    """With tiers, each level's resident bytes and IO counters are in the sample."""
    from kvmap.request import SamplingParams
    llm = make_tiny_llm(kv="fp32+tiers(host=1MiB)", num_blocks=8)
    engine = llm.engine
    for i in range(4):               # distinct prompts through an 8-block pool: demotions
        engine.add_request([1 + i] * 12, SamplingParams(max_tokens=2, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    snap = snapshot(engine)
    host = engine.offload.levels[0].tier
    assert snap["kv_resident_bytes_host"] == host.used_bytes > 0
    assert snap["tier_host_bytes_written"] == host.stats.bytes_written > 0
    engine.close()


def test_snapshot_during_a_prefill_counts_the_chunk_as_held():
    """Between scheduling and the forward pass a prompt's blocks are allocated and its
    slots not yet counted: the waste is the last block's empty tail, not the prompt."""
    engine = make_tiny_llm().engine
    from kvmap.request import SamplingParams
    engine.add_request([1] * 10, SamplingParams(max_tokens=5, ignore_eos=True))
    engine.scheduler.schedule()              # what step() does before the forward pass
    (req,) = engine.scheduler.running
    per_slot = engine.kv.bytes_per_block // engine.kv.block_size
    assert req.num_kv_slots == 0 and len(req.block_ids) == 3
    assert snapshot(engine)["kv_waste_bytes"] == 2 * per_slot


def test_time_weighted_mean():
    assert time_weighted_mean([0.0, 1.0, 3.0], [4.0, 1.0, 9.0]) == pytest.approx(2.0)
    assert time_weighted_mean([], []) is None


def test_write_and_read_back(tmp_path):
    from kvmap.runs.record import CellRecord
    record = CellRecord(cell_id="c1", kind="workload", model="m", dtype="fp32", kv="fp32",
                        metrics={"timeseries": {"t_s": [0.0, 0.1], "rss_bytes": [1, 2]}})
    path = write_timeseries(tmp_path, record)
    assert path == tmp_path / "timeseries" / "c1.parquet"
    assert "timeseries" not in record.metrics
    table = RunStore(tmp_path).timeseries("c1")
    assert table.column("rss_bytes").to_pylist() == [1, 2]
    assert RunStore(tmp_path).timeseries("nope") is None


def test_report_draws_stored_series(tmp_path):
    import base64
    from kvmap.runs.record import CellRecord
    from kvmap.report.timeseries import timeseries_figures
    record = CellRecord(cell_id="c1", kind="workload", model="m", dtype="fp32", kv="fp32",
                        workload="w", metrics={"timeseries": {
                            "t_s": [0.0, 0.1, 0.2], "rss_bytes": [10, 20, 30],
                            "num_running": [0, 4, 0], "num_waiting": [4, 0, 0],
                            "disk_read_bytes": [0, 100, 300]}})
    write_timeseries(tmp_path, record)
    cells = [record, CellRecord(cell_id="c2", kind="task", model="m", dtype="fp32",
                                kv="fp32", task="t")]
    (label, png), = timeseries_figures(tmp_path, cells)
    assert label == "fp32 | w"
    assert base64.b64decode(png)[:8] == b"\x89PNG\r\n\x1a\n"


def test_server_exports_waste_and_disk_io():
    from kvmap.request import SamplingParams
    from kvmap.server.metrics import ServerMetrics
    llm = make_tiny_llm()
    llm.engine.add_request([1] * 10, SamplingParams(max_tokens=5, ignore_eos=True))
    llm.engine.step()
    m = ServerMetrics("tiny", 128)
    m.update_engine_state([llm.engine], 0)
    text = m.render().decode()
    per_slot = llm.engine.kv.bytes_per_block // llm.engine.kv.block_size
    line = next(l for l in text.splitlines() if l.startswith("kvmap:kv_waste_bytes{"))
    assert float(line.split()[-1]) == 2 * per_slot
    assert "kvmap:process_disk_read_bytes_total" in text


def test_bench_run_stores_series_and_waste_keys(tmp_path):
    import textwrap
    from kvmap.bench.runner import run_scenario
    from kvmap.bench.scenario import load_scenario
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent("""
        models: ["dummy:tiny"]
        engine: {kv_memory: 1MiB, block_size: 4, max_num_batched_tokens: 64}
        kv: [fp32]
        workloads:
          - {name: tp, kind: synthetic, num_requests: 4, prompt_len: 10, output_len: 30,
             arrival: "closed:2"}
        """))
    out = tmp_path / "run"
    run_scenario(load_scenario(path), out, show_progress=False)
    store = RunStore(out)
    (cell,) = store.cells()
    assert cell.status == "ok", cell.error
    assert "timeseries" not in cell.metrics                  # moved to its own file
    assert {"kv_waste_bytes_max", "kv_waste_bytes_mean", "kv_waste_share_mean"} \
        <= set(cell.metrics)
    table = store.timeseries(cell.cell_id)
    assert table is not None and table.num_rows >= 2
    assert max(table.column("num_running").to_pylist()) <= 2
