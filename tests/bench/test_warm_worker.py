"""Cells forked from a warm worker: one worker serves a model's cells, a crash or a
timeout stays in its cell, the worker's weights are handed to each cell untouched."""
from __future__ import annotations

import textwrap

import pytest

from kvmap.bench.local_backend import LocalBackend
from kvmap.bench.runner import run_scenario
from kvmap.bench.scenario import load_scenario
from kvmap.runs.store import RunStore

TASKS = '''
import os, time

def ok(llm):
    return {"accuracy": 1.0, "pid": os.getpid()}

def crash(llm):
    os._exit(3)

def sleepy(llm):
    time.sleep(60)
    return {}
'''


def test_cells_fork_from_one_worker_and_failures_stay_in_their_cell(tmp_path):
    (tmp_path / "t.py").write_text(TASKS)
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent("""
        models: ["dummy:tiny"]
        engine: {kv_memory: 1MiB, block_size: 4, max_num_batched_tokens: 64}
        kv: [fp32]
        cell_timeout_s: 8
        workloads:
          - {name: tp, kind: synthetic, num_requests: 2, prompt_len: 8, output_len: 2}
        tasks:
          - {name: a, task: "t.py:ok"}
          - {name: boom, task: "t.py:crash"}
          - {name: slow, task: "t.py:sleepy"}
          - {name: b, task: "t.py:ok"}
        """))
    scenario = load_scenario(path)
    backend = LocalBackend()
    result = run_scenario(scenario, tmp_path / "run", backend=backend, show_progress=False)
    cells = {c.job: c.to_dict() for c in RunStore(tmp_path / "run").cells()}
    assert cells["tp"]["status"] == "ok" and cells["tp"]["metrics"]["num_completed"] == 2
    assert cells["boom"]["status"] == "failed" and "code 3" in cells["boom"]["error"]
    assert cells["slow"]["status"] == "failed" and "timed out" in cells["slow"]["error"]
    assert cells["a"]["status"] == cells["b"]["status"] == "ok"
    # each cell its own process, all forked from one worker started once
    assert cells["a"]["metrics"]["pid"] != cells["b"]["metrics"]["pid"]
    workers = backend.describe()["warm_workers"]
    assert len(workers) == 1 and workers[0]["model"] == "dummy:tiny"
    assert result.num_failed == 2


def test_kept_weights_are_handed_out_fresh():
    import torch

    from kvmap.model import preload
    from kvmap.model.loader import load_model, preload_model
    try:
        kept = preload_model("dummy:tiny", "fp32")
        first = load_model("dummy:tiny", torch.float32)
        first.weights.clear()                        # the engine empties its copy
        second = load_model("dummy:tiny", torch.float32)
        assert second.weights and set(second.weights) == set(kept.weights)
        assert all(second.weights[k] is kept.weights[k] for k in kept.weights)
    finally:
        preload.forget()


def test_warm_off_runs_fresh_processes(tmp_path, monkeypatch):
    monkeypatch.setenv("KVMAP_BENCH_WARM", "0")
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent("""
        models: ["dummy:tiny"]
        engine: {kv_memory: 1MiB, block_size: 4, max_num_batched_tokens: 64}
        kv: [fp32]
        workloads:
          - {name: tp, kind: synthetic, num_requests: 1, prompt_len: 8, output_len: 2}
        """))
    backend = LocalBackend()
    run_scenario(load_scenario(path), tmp_path / "run", backend=backend, show_progress=False)
    assert "warm_workers" not in backend.describe()
    assert RunStore(tmp_path / "run").cells()[0].ok
