"""The scenario runner end to end on the tiny random model ("dummy:tiny"): scenario
validation, cells in their own processes, a failing cell, a timeout, resume after an
interruption, the run directory round trip, a user text file and JSONL trace, the CLI."""
from __future__ import annotations

import json
import sqlite3
import textwrap

import pytest
import typer
from typer.testing import CliRunner

from kvmap.bench import runner as runner_mod
from kvmap.bench.command import register
from kvmap.report.command import bench_tradeoff_map
from kvmap.bench.runner import run_scenario
from kvmap.bench.scenario import ScenarioError, load_scenario
from kvmap.runs.store import RunStore
from kvmap.bench.summary import cell_rows, summary_rows, summary_table

TASKS_PY = '''
import time

def kv_probe(llm, tokens=8):
    """A stub accuracy task: the KV bytes of a short greedy generation."""
    from kvmap import SamplingParams
    out = llm.generate([list(range(3, 3 + tokens))], SamplingParams(max_tokens=4))[0]
    return {"accuracy": 1.0, "n": 1, "num_output_tokens": len(out.token_ids)}

def boom(llm):
    raise RuntimeError("boom: this task always fails")

def sleepy(llm, seconds=60):
    time.sleep(seconds)
    return {}
'''

ENGINE = "engine: {kv_memory: 1MiB, block_size: 4, max_num_batched_tokens: 64}"


def write_scenario(tmp_path, body: str, name: str = "s.yaml"):
    (tmp_path / "my_tasks.py").write_text(TASKS_PY)
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


@pytest.fixture
def user_files(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text(" ".join(f"Sentence number {i} talks about caches and memory." for i in
                             range(200)))
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(json.dumps(r) for r in (
        {"arrival_s": 0.0, "prompt": "Hello there, how are the caches?", "max_tokens": 3},
        {"arrival_s": 0.05, "prompt_tokens": 20, "max_tokens": 2},
        {"arrival_s": 0.10, "prompt": "A third request arrives a bit later.",
         "max_tokens": 3})))
    return text, trace


def test_run_store_and_summary(tmp_path, user_files):
    """Two KV configs x (user text workload, JSONL trace, stub task, failing task)."""
    path = write_scenario(tmp_path, f"""
        name: tiny
        models: ["dummy:tiny"]
        {ENGINE}
        kv: [fp32, "int8"]
        workloads:
          - {{name: text, kind: synthetic, num_requests: 3, prompt_len: 24, output_len: 3,
              arrival: "closed:2", corpus: notes.txt}}
          - {{name: replay, kind: trace, trace: trace.jsonl}}
        tasks:
          - {{name: probe, task: "my_tasks.py:kv_probe", params: {{tokens: 6}}}}
        slo: "ttft=30s,tpot=10s"
        """)
    scenario = load_scenario(path)
    assert len(scenario.cells()) == 6
    out = tmp_path / "run"
    result = run_scenario(scenario, out, show_progress=False)
    assert result.num_ran == 6 and result.num_failed == 0, [c.error for c in result.cells]

    store = RunStore(out)
    meta = store.metadata()
    assert meta["schema"] == "kvmap.bench.run/1" and meta["seed"] == 0
    assert meta["fingerprint"] == scenario.fingerprint()
    assert {"git", "versions", "machine", "scenario"} <= set(meta)
    assert meta["versions"]["torch"] and meta["machine"]["num_cpus"] >= 1
    assert (out / "scenario.yaml").read_text() == path.read_text()
    with sqlite3.connect(out / "index.sqlite") as conn:
        assert conn.execute("SELECT count(*) FROM cells WHERE status='ok'").fetchone() == (6,)
        assert json.loads(conn.execute("SELECT value FROM run WHERE key='seed'"
                                       ).fetchone()[0]) == 0

    cells = store.cells()
    text = next(c for c in cells if c.workload == "text" and c.kv == "fp32")
    m = text.metrics
    assert m["num_completed"] == 3 and m["num_output_tokens"] == 9
    assert m["ttft_s"]["p50"] > 0 and m["tbt_s"]["p99"] >= m["tbt_s"]["p50"]
    assert m["peak_kv_resident_bytes"] > 0 and m["peak_rss_bytes"] > 0
    assert m["kv_bytes_per_token"] == 2 * 2 * 2 * 16 * 4          # 2 layers, fp32
    assert m["max_num_running_seqs"] == 2 and m["goodput_requests_per_s"] > 0
    int8 = next(c for c in cells if c.workload == "text" and c.kv == "int8")
    assert int8.metrics["kv_bytes_per_token"] < m["kv_bytes_per_token"]
    probe = next(c for c in cells if c.task == "probe")
    assert probe.metrics["accuracy"] == 1.0 and probe.metrics["num_output_tokens"] == 4

    table = store.requests()
    assert table.num_rows == 2 * (3 + 3)
    replay = [r for r in table.to_pylist() if r["workload"] == "replay" and r["kv"] == "fp32"]
    assert [r["scheduled_arrival_s"] for r in replay] == [0.0, 0.05, 0.10]
    # open loop: each request's arrival is its scheduled time, not when the loop got to it
    assert all(abs(r["arrival_s"] - r["scheduled_arrival_s"]) < 1e-6 for r in replay)
    assert all(not r["failed"] and len(r["token_times_s"]) == r["num_output_tokens"]
               for r in replay)

    rows = summary_rows(cells)
    assert [r["kv"] for r in rows] == ["fp32", "int8"] and rows[0]["status"] == "ok"
    assert rows[0]["probe"].startswith("100%")
    summary_table(cells)                                  # renders without error
    assert {r["cell_id"] for r in cell_rows(cells)} == {c.cell_id for c in scenario.cells()}


def test_failed_cell_recorded_and_resume_after_interrupt(tmp_path, monkeypatch):
    path = write_scenario(tmp_path, f"""
        models: ["dummy:tiny"]
        {ENGINE}
        kv: [fp32]
        workloads:
          - {{name: tp, kind: synthetic, num_requests: 2, prompt_len: 8, output_len: 2}}
        tasks:
          - {{name: broken, task: "my_tasks.py:boom"}}
          - {{name: probe, task: "my_tasks.py:kv_probe"}}
        """)
    scenario = load_scenario(path)
    out = tmp_path / "run"
    real = runner_mod.run_cell_process
    calls = []

    def interrupt_third(cell, store, *args, **kwargs):
        calls.append(cell.job)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(cell, store, *args, **kwargs)

    monkeypatch.setattr(runner_mod, "run_cell_process", interrupt_third)
    with pytest.raises(KeyboardInterrupt):
        run_scenario(scenario, out, show_progress=False)
    store = RunStore(out)
    stored = {c.task or c.workload: c for c in store.cells()}
    assert set(stored) == {"tp", "broken"}
    assert stored["broken"].status == "failed"
    assert "boom: this task always fails" in stored["broken"].error
    assert "RuntimeError" in stored["broken"].traceback
    assert store.metadata()["interrupted"] is True

    monkeypatch.setattr(runner_mod, "run_cell_process", real)
    result = run_scenario(scenario, out, show_progress=False)
    assert result.resumed and result.num_ran == 1 and result.num_skipped == 2
    assert result.num_failed == 1
    assert [c.task or c.workload for c in result.cells] == ["tp", "broken", "probe"]
    assert RunStore(out).metadata()["interrupted"] is False
    assert RunStore(out).requests().num_rows == 2

    # the same directory with another scenario is refused
    other = load_scenario(write_scenario(tmp_path, f"""
        models: ["dummy:tiny"]
        {ENGINE}
        kv: [int8]
        workloads: [{{name: tp, kind: synthetic, num_requests: 1}}]
        """, "other.yaml"))
    with pytest.raises(ValueError, match="holds scenario"):
        run_scenario(other, out, show_progress=False)


def test_cell_timeout(tmp_path):
    path = write_scenario(tmp_path, f"""
        models: ["dummy:tiny"]
        {ENGINE}
        cell_timeout_s: 8
        tasks: [{{name: slow, task: "my_tasks.py:sleepy"}}]
        """)
    result = run_scenario(load_scenario(path), tmp_path / "run", show_progress=False)
    (cell,) = result.cells
    assert cell.status == "failed" and "timed out after 8 s" in cell.error


@pytest.mark.parametrize("body, expected", [
    ("modles: [x]\ntasks: [{name: p, task: 'my_tasks.py:kv_probe'}]", "unknown key 'modles'"),
    ("kv: ['int9']\ntasks: [{name: p, task: 'my_tasks.py:kv_probe'}]", "kv[0]: unknown KV spec part 'int9'"),
    ("kv: ['int8(bits=3)']\ntasks: [{name: p, task: 'my_tasks.py:kv_probe'}]", "has no option 'bits'"),
    ("kv: ['int4(group_size=48)']\ntasks: [{name: p, task: 'my_tasks.py:kv_probe'}]",
     "does not divide head_dim=16"),
    ("tasks: [nosuch]", "unknown task 'nosuch'"),
    ("tasks: [{name: p, task: 'my_tasks.py:kv_probe', params: {colour: red}}]",
     "does not take ['colour']"),
    ("tasks: [{name: mc, params: {data_path: missing.jsonl}}]", "missing.jsonl' does not exist"),
    ("workloads: [{name: t, kind: trace, trace: nothere.jsonl}]", "nothere.jsonl' does not exist"),
    ("workloads: [{name: t, kind: synthetic, corpus: nothere.txt}]", "nothere.txt' does not exist"),
    ("workloads: [{name: t, kind: synthetic, prompt_len: 600}]",
     "600 tokens do not fit the context of model 'dummy:tiny' (512 tokens)"),
    ("workloads: [{name: t, kind: synthetic, colour: red}]", "t).colour: unknown key"),
    ("workloads: [{name: t, kind: synthetic}]\nslo: 'ttft=5'", "not a duration with a unit"),
])
def test_bad_scenarios_refused_before_any_cell(tmp_path, monkeypatch, body, expected):
    monkeypatch.setattr(runner_mod, "run_cell_process",
                        lambda *a, **k: pytest.fail("a cell ran"))
    path = write_scenario(tmp_path, f"models: ['dummy:tiny']\n{body}\n")
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert expected in str(info.value) and str(path) in str(info.value)


def test_problems_are_reported_together(tmp_path):
    path = write_scenario(tmp_path, "models: ['dummy:tiny']\nkv: [int9]\nbogus: 1\n"
                                    "workloads: [{name: t, kind: synthetic}]\n")
    with pytest.raises(ScenarioError, match=r"2 problem\(s\)"):
        load_scenario(path)


@pytest.mark.slow          # reads the embedded model's shape (no weights are loaded)
def test_builtin_scenarios_parse():
    default, quick = load_scenario(None), load_scenario(None, quick=True)
    assert default.name == "default" and quick.name == "quick"
    assert default.kv[0] == "auto" and {w.name for w in default.workloads} == {
        "s1-throughput", "s1-throughput-8b", "s2-long-context", "s2-long-context-8b",
        "s1-throughput-gemma", "long-context-gemma"}
    assert {t.name for t in default.tasks} == {"ppl", "ppl-policies", "passkey",
                                               "passkey-gemma", "chat_generation"}
    assert {m.label for m in default.models} >= {"smollm2", "smollm2+w8a8", "gemma3-270m"}
    assert [c.model.label for c in quick.cells()].count("gemma3-270m") == 1
    assert len(quick.cells()) < len(default.cells())


def test_quick_shrinks_a_user_scenario(tmp_path):
    path = write_scenario(tmp_path, """
        models: ['dummy:tiny']
        workloads: [{name: t, kind: synthetic, num_requests: 50, prompt_len: 16,
                     output_len: 100}]
        """)
    (w,) = load_scenario(path, quick=True).workloads
    spec = w.spec()
    assert spec.num_requests == 4 and spec.output_len.num_tokens == 16


def test_cli_json(tmp_path):
    path = write_scenario(tmp_path, f"""
        models: ["dummy:tiny"]
        {ENGINE}
        kv: [fp32]
        workloads:
          - {{name: tp, kind: synthetic, num_requests: 2, prompt_len: 8, output_len: 2}}
        """)
    app = typer.Typer()
    app.callback()(lambda: None)
    register(app, tradeoff_map=bench_tradeoff_map)
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["bench", str(path), "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout.strip().splitlines()[-1])
    assert data["run_dir"] == str(out)
    (row,) = data["cells"]
    assert row["status"] == "ok" and row["metrics"]["num_output_tokens"] == 4

    bad = write_scenario(tmp_path, "kv: [int9]\n", "bad.yaml")
    result = CliRunner().invoke(app, ["bench", str(bad)])
    assert result.exit_code == 2 and "unknown KV spec part 'int9'" in result.output
