"""``kill -9`` of ``kvmap bench`` at random points, then resume: the final run has the same
cells as an uninterrupted one -- same statuses, accuracy figures and generated tokens --
with nothing duplicated and nothing lost. Bounded: a 3-cell scenario on the tiny random
model, three seeds."""
from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kvmap.runs.store import RunStore

# the task outlasts the kill's random delay (up to 1 s): a cell forked from a warm worker
# starts in a fraction of a second, and the kill must land while one runs
TASKS_PY = '''
def probe(llm, tokens=6):
    import time
    time.sleep(1.5)
    from kvmap import SamplingParams
    out = llm.generate([list(range(3, 3 + tokens))], SamplingParams(max_tokens=3))[0]
    return {"accuracy": sum(out.token_ids) % 7 / 7, "n": 1,
            "tokens": list(out.token_ids)}
'''
SCENARIO = """
    name: killme
    models: [dummy:tiny]
    engine: {kv_memory: 1MiB, block_size: 4, max_num_batched_tokens: 64}
    kv: [int8]
    workloads:
      - {name: tp, kind: synthetic, num_requests: 3, prompt_len: 12, output_len: 3}
      - {name: tp2, kind: synthetic, num_requests: 2, prompt_len: 20, output_len: 4}
    tasks:
      - {name: probe, task: "tasks.py:probe"}
    """
SEEDS = [1, 2, 3]


def bench_cmd(folder: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "kvmap.cli", "bench", str(folder / "s.yaml"), "--out",
            str(out), "--json"]


def env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


def summary(run_dir: Path):
    """What must not differ between runs: per cell its status and task figures, per
    request its generated tokens; plus the counts that catch duplicates."""
    store = RunStore(run_dir)
    cells = store.cells()
    rows = store.requests().to_pylist()
    keys = [(r["cell_id"], r["request_id"]) for r in rows]
    assert len(keys) == len(set(keys)), "a request row is duplicated"
    per_cell = {c.cell_id: (c.status, c.metrics.get("accuracy"),
                               c.metrics.get("tokens")) for c in cells}
    assert len(per_cell) == len(cells), "a cell is duplicated"
    tokens = sorted((r["cell_id"], r["request_id"], r["output_text"],
                     r["num_output_tokens"]) for r in rows)
    return per_cell, tokens


def stored_cells(out: Path) -> int:
    try:
        return len(RunStore(out).cells())
    except (sqlite3.Error, OSError, ValueError):
        return 0


def kill_at_a_random_point(folder: Path, out: Path, seed: int, num_cells: int) -> dict:
    """Start ``kvmap bench``; once ``seed % num_cells`` cells are stored (so seeds 1, 2, 3
    kill it after one, two and no cells), wait a seeded fraction of a second more and
    SIGKILL it."""
    target, extra_s = seed % num_cells, random.Random(seed).uniform(0.0, 1.0)
    proc = subprocess.Popen(bench_cmd(folder, out), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env())
    deadline = time.monotonic() + 300
    while proc.poll() is None and stored_cells(out) < target and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(extra_s)
    killed = proc.poll() is None
    if killed:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return {"seed": seed, "after_cells": target, "extra_s": extra_s, "killed": killed,
            "cells_stored_at_kill": stored_cells(out)}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("killresume")
    (folder / "tasks.py").write_text(TASKS_PY)
    (folder / "s.yaml").write_text(textwrap.dedent(SCENARIO))
    return folder


@pytest.fixture(scope="module")
def uninterrupted(folder):
    out = folder / "clean"
    done = subprocess.run(bench_cmd(folder, out), capture_output=True, text=True, env=env(),
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    per_cell, tokens = summary(out)
    assert len(per_cell) == 3 and all(s == "ok" for s, _, _ in per_cell.values())
    return per_cell, tokens


@pytest.mark.parametrize("seed", SEEDS)
def test_kill_9_then_resume_equals_an_uninterrupted_run(seed, folder, uninterrupted):
    expected_cells, expected_tokens = uninterrupted
    out = folder / f"killed-{seed}"
    kill = kill_at_a_random_point(folder, out, seed, len(expected_cells))
    assert kill["killed"], kill                  # it was still running: a real interruption
    assert kill["cells_stored_at_kill"] < len(expected_cells)
    done = subprocess.run(bench_cmd(folder, out), capture_output=True, text=True, env=env(),
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    cells, tokens = summary(out)
    assert cells == expected_cells
    assert tokens == expected_tokens
