"""Issue 14 on the bench side: a KV budget in the model's bf16 tokens, load sweeps as
one cell per level with the concurrency keys of the record contract, and the scenario
errors that come before any cell runs. On ``dummy:tiny`` (2 layers, 2 KV heads of 16)."""
from __future__ import annotations

import textwrap

import pytest

from kvmap import LLM
from kvmap.bench.runner import run_scenario
from kvmap.bench.scenario import ScenarioError, load_scenario
from kvmap.runs.store import RunStore

CONTRACT_KEYS = ("concurrency_max", "concurrency_mean", "waiting_max", "waiting_mean",
                 "num_pool_full_steps", "num_preemptions_engine", "kv_capacity_bytes",
                 "kv_capacity_tokens", "kv_budget_tokens_bf16", "output_tokens_per_s",
                 "output_throughput_windows_tok_s", "tier_errors", "weight_bytes")


def _scenario(tmp_path, body: str):
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(body))
    return load_scenario(path)


def test_token_budget_is_the_same_bytes_for_every_codec():
    bf16_bytes_per_token = 2 * 2 * 2 * 16 * 2            # K and V, 2 layers x 2 heads x 16
    budgets, tokens = set(), {}
    for kv in ("bf16", "fp32", "int8", "int4"):
        llm = LLM("dummy:tiny", kv=kv, kv_memory="256 tokens", block_size=4)
        budgets.add(llm.engine.kv_budget_bytes())
        stats = llm.stats()
        assert stats.capacity_bytes <= 256 * bf16_bytes_per_token
        tokens[kv] = stats.capacity_tokens
    assert budgets == {256 * bf16_bytes_per_token}
    assert tokens["bf16"] == 256 and tokens["fp32"] == 128
    assert tokens["int8"] > 1.5 * tokens["bf16"] and tokens["int4"] > tokens["int8"]


def test_bad_kv_memory_names_the_value():
    with pytest.raises(ValueError, match="'3072 tokenz'"):
        LLM("dummy:tiny", kv_memory="3072 tokenz")


def test_problems_of_issue_14_are_reported_together(tmp_path):
    with pytest.raises(ScenarioError) as err:
        _scenario(tmp_path, """
            models: ["dummy:tiny"]
            engine: {kv_memory: 32 tokens, block_size: 4}
            kv: [bf16, int8]
            workloads:
              - {name: big, kind: synthetic, num_requests: 2, prompt_len: 40, output_len: 8}
              - {name: down, kind: synthetic, num_requests: 2, prompt_len: 8, output_len: 2,
                 arrival: [closed:8, closed:4]}
              - {name: elsewhere, kind: synthetic, num_requests: 1, models: [smollm3]}
            slo: "ttft=1s,latency_p99=2s"
            """)
    text = str(err.value)
    assert "4 problem(s)" in text, text
    assert "['smollm3'] must be a non-empty list of the scenario's models" in text
    assert "'32 tokens' holds 32 tokens with KV spec 'bf16'" in text
    assert "must increase" in text and "'closed:4' after 'closed:8'" in text
    assert "latency_p99" in text


def test_load_sweep_is_one_cell_per_level_with_the_contract_keys(tmp_path):
    scenario = _scenario(tmp_path, """
        models: ["dummy:tiny"]
        engine: {kv_memory: 64 tokens, block_size: 4, max_num_batched_tokens: 64}
        kv: [bf16]
        workloads:
          - {name: sweep, kind: synthetic, num_requests: [2, 8], prompt_len: 12,
             output_len: 4, arrival: [closed:1, closed:8], kv: [bf16, int8]}
        """)
    cells = scenario.cells()
    assert [(c.kv, c.workload.load["label"]) for c in cells] == [
        ("bf16", "closed:1"), ("bf16", "closed:8"), ("int8", "closed:1"), ("int8", "closed:8")]
    assert len({c.cell_id for c in cells}) == 4
    result = run_scenario(scenario, tmp_path / "run", show_progress=False)
    assert result.num_failed == 0, [c.error for c in result.cells]
    records = {(c.kv, c.load["label"]): c for c in RunStore(tmp_path / "run").cells()}
    for record in records.values():
        assert record.workload == "sweep" and record.load["kind"] == "closed"
        m = record.metrics
        assert all(k in m for k in CONTRACT_KEYS), sorted(set(CONTRACT_KEYS) - set(m))
        assert 0 < m["concurrency_mean"] <= m["concurrency_max"]
        assert m["kv_budget_tokens_bf16"] == 64 and m["tier_errors"] == 0
        assert len(m["output_throughput_windows_tok_s"]) == 10
    assert records[("bf16", "closed:1")].load["value"] == 1.0
    assert records[("bf16", "closed:1")].metrics["concurrency_max"] == 1
    # 8 requests of 16 tokens (4 blocks) in a 16-block pool: bf16 binds, int8 holds more
    bf16, int8 = records[("bf16", "closed:8")].metrics, records[("int8", "closed:8")].metrics
    assert bf16["kv_capacity_tokens"] == 64 and int8["kv_capacity_tokens"] > 64
    assert bf16["concurrency_max"] < int8["concurrency_max"]
    assert bf16["num_pool_full_steps"] > 0 and bf16["waiting_max"] > 0


def test_dummy_model_runs_no_accuracy_task(tmp_path):
    scenario = _scenario(tmp_path, """
        models: ["dummy:tiny", "dummy:llama-3-8b?layers=1&vocab=512"]
        engine: {kv_memory: 1MiB}
        kv: [bf16]
        workloads: [{name: w, kind: synthetic, num_requests: 1, prompt_len: 8, output_len: 2}]
        tasks: [{name: passkey, params: {context_tokens: [256], num_samples: 1}}]
        """)
    assert [c.kind for c in scenario.cells()] == ["workload", "workload"]
    only = _scenario(tmp_path, """
        models: ["dummy:tiny", "dummy:llama-3-8b?layers=1&vocab=512"]
        engine: {kv_memory: 1MiB}
        workloads: [{name: w, kind: synthetic, num_requests: 1, prompt_len: 8,
                     output_len: 2, models: ["dummy:tiny"]}]
        """)
    assert [c.model.name for c in only.cells()] == ["dummy:tiny"]
    assert any("n/a" in note for note in scenario.notes)


def test_serve_takes_a_token_budget():
    """``kvmap serve --kv-memory "256 tokens"``: every engine of the server gets the
    same bytes, so the adaptive controller's int8 engine holds more tokens."""
    from kvmap.config import EngineArgs
    from kvmap.server.engines import make_engine_factory
    first, factory = make_engine_factory(
        EngineArgs(model="dummy:tiny", kv="bf16", kv_memory="256 tokens", block_size=4))
    int8 = factory("int8")
    assert first.kv_budget_bytes() == int8.kv_budget_bytes() == 256 * 2 * 2 * 2 * 16 * 2
    assert first.stats().capacity_tokens == 256 < int8.stats().capacity_tokens


def test_quantized_model_entry_has_its_own_jobs_by_label(tmp_path):
    scenario = _scenario(tmp_path, """
        models: ["dummy:tiny", {name: "dummy:tiny", quantization: int8}]
        engine: {kv_memory: 64 tokens, block_size: 4}
        kv: [bf16, int8]
        workloads:
          - {name: w, kind: synthetic, num_requests: 2, prompt_len: 8, output_len: 2,
             models: ["dummy:tiny"]}
          - {name: w, kind: synthetic, num_requests: 2, prompt_len: 8, output_len: 2,
             models: ["dummy:tiny+int8"], kv: [int8]}
        """)
    cells = scenario.cells()
    assert [(c.model.label, c.kv) for c in cells] == [
        ("dummy:tiny", "bf16"), ("dummy:tiny", "int8"), ("dummy:tiny+int8", "int8")]
    assert len({c.cell_id for c in cells}) == 3
    assert cells[2].engine_args().quantization == "int8"
    with pytest.raises(ScenarioError, match="used twice"):
        _scenario(tmp_path, """
            models: ["dummy:tiny", {name: "dummy:tiny", quantization: int8}]
            engine: {kv_memory: 64 tokens, block_size: 4}
            workloads:
              - {name: w, kind: synthetic, num_requests: 2, prompt_len: 8, output_len: 2}
              - {name: w, kind: synthetic, num_requests: 2, prompt_len: 8, output_len: 2,
                 models: ["dummy:tiny+int8"]}
            """)
    with pytest.raises(ScenarioError, match=r"'w4' is not one of int8, w8a8, int4"):
        _scenario(tmp_path, """
            models: [{name: "dummy:tiny", quantization: w4}]
            workloads: [{name: w, kind: synthetic, num_requests: 1}]
            """)
