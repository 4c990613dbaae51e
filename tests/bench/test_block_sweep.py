"""Issue 19.2 on the bench side: ``block_size: [...]`` in a workload is one cell per block
size (named ``<workload>@bs<size>``, run at that block size, the record carrying
``kv_block_size``), and its bad values are reported with every other problem before any
cell runs. On ``dummy:tiny`` (512-token context; 2 layers, 2 KV heads of 16)."""
from __future__ import annotations

import textwrap

import pytest

from kvmap.bench.runner import run_scenario
from kvmap.bench.scenario import ScenarioError, load_scenario
from kvmap.runs.names import base_name, sweep_name
from kvmap.runs.store import RunStore


def _scenario(tmp_path, body: str):
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(body))
    return load_scenario(path)


def test_names_round_trip():
    assert sweep_name("frag", 16) == "frag@bs16" and base_name("frag@bs16") == "frag"
    assert base_name("frag") == "frag" and base_name("a@bsx") == "a@bsx"


def test_block_sizes_expand_into_cells_with_loads_and_kv(tmp_path):
    scenario = _scenario(tmp_path, """
        models: ["dummy:tiny"]
        engine: {kv_memory: 256 tokens, block_size: 4}
        kv: [bf16, int8]
        workloads:
          - {name: frag, kind: synthetic, num_requests: [2, 4], prompt_len: 12,
             output_len: 4, arrival: [closed:1, closed:4], block_size: [8, 16, 32]}
          - {name: one, kind: synthetic, num_requests: 1, prompt_len: 8, output_len: 2,
             block_size: 8, kv: [bf16]}
          - {name: plain, kind: synthetic, num_requests: 1, prompt_len: 8, output_len: 2,
             kv: [bf16]}
        """)
    cells = scenario.cells()
    got = [(c.kv, c.workload.name, c.engine.block_size,
            (c.workload.load or {}).get("label")) for c in cells]
    frag = [(kv, f"frag@bs{b}", b, load) for kv in ("bf16", "int8") for b in (8, 16, 32)
            for load in ("closed:1", "closed:4")]
    assert [g for g in got if g[1].startswith("frag")] == frag
    assert ("bf16", "one", 8, None) in got            # a bare integer keeps the name
    assert ("bf16", "plain", 4, None) in got          # no key: the scenario's engine
    assert len({c.cell_id for c in cells}) == len(cells)
    assert "bs16" in next(c.cell_id for c in cells if c.engine.block_size == 16)


@pytest.mark.parametrize("value, message", [
    ("[8, 8, 16]", "must be strictly increasing"),
    ("[16, 8]", "must be strictly increasing"),
    ("[0, 8]", "must be a positive integer or a non-empty list of them (bad: 0)"),
    ("[-4]", "(bad: -4)"),
    ("[8, 2.5]", "(bad: 2.5)"),
    ("[]", "is empty"),
])
def test_bad_block_size_lists(tmp_path, value, message):
    with pytest.raises(ScenarioError) as err:
        _scenario(tmp_path, f"""
            models: ["dummy:tiny"]
            engine: {{kv_memory: 256 tokens}}
            workloads:
              - {{name: frag, kind: synthetic, num_requests: 1, prompt_len: 8, output_len: 2,
                 block_size: {value}}}
            """)
    assert "workloads[0] (frag).block_size" in str(err.value) and message in str(err.value)


def test_block_size_against_context_and_pool_with_other_problems(tmp_path):
    with pytest.raises(ScenarioError) as err:
        _scenario(tmp_path, """
            models: ["dummy:tiny"]
            engine: {kv_memory: 64 tokens}
            kv: [bf16]
            workloads:
              - {name: frag, kind: synthetic, num_requests: 1, prompt_len: 8, output_len: 2,
                 block_size: [8, 24, 128]}
              - {name: big, kind: synthetic, num_requests: 1, prompt_len: 80, output_len: 2}
            slo: "latency_p99=2s"
            """)
    text = str(err.value)
    assert "4 problem(s)" in text, text
    assert ("workloads (frag@bs24).block_size: block_size=24 does not divide the context of "
            "model 'dummy:tiny' (512 tokens)") in text
    assert "workloads (frag@bs128).block_size: block_size=128 exceeds the pool" in text
    assert "frag@bs8" not in text                     # 8 divides 512, 64 tokens hold it
    assert "holds 64 tokens with KV spec 'bf16'" in text and "latency_p99" in text


def test_each_block_size_runs_at_its_size_and_records_it(tmp_path):
    scenario = _scenario(tmp_path, """
        models: ["dummy:tiny"]
        engine: {kv_memory: 512 tokens, max_num_batched_tokens: 64}
        kv: [fp32]
        workloads:
          - {name: frag, kind: synthetic, num_requests: 3, prompt_len: 13, output_len: 3,
             arrival: closed:3, block_size: [4, 16]}
        """)
    result = run_scenario(scenario, tmp_path / "run", show_progress=False)
    assert result.num_failed == 0, [c.error for c in result.cells]
    records = {c.workload: c.metrics for c in RunStore(tmp_path / "run").cells()}
    assert set(records) == {"frag@bs4", "frag@bs16"}
    for size in (4, 16):
        m = records[f"frag@bs{size}"]
        assert m["kv_block_size"] == size
        assert m["kv_capacity_tokens"] == m["num_kv_blocks"] * size == 256   # fp32: 2x bf16
        assert m["kv_waste_bytes_max"] >= m["kv_waste_bytes_mean"] >= 0     # measured keys


def test_the_example_scenario_sweeps_block_sizes_and_runs_the_builtin_qa():
    from pathlib import Path
    path = Path(__file__).parents[2] / "examples" / "block-sizes.yaml"
    cells = load_scenario(path).cells()
    sweep = [(c.kv, c.engine.block_size) for c in cells if c.kind == "workload"]
    assert sweep == [(kv, b) for kv in ("bf16", "int8") for b in (8, 16, 32, 64)]
    qa = [c for c in cells if c.kind == "task"]
    assert [c.kv for c in qa] == ["bf16", "int8", "snapkv(budget=0.25)"]
    assert all(c.task.task == "qa" and "data_path" not in c.task.params for c in qa)
