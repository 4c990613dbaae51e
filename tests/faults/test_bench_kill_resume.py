"""``kill -9`` of ``kvmap bench`` at random points, then resume: the final run has the same
cells as an uninterrupted one -- same statuses, accuracy figures and generated tokens --
with nothing duplicated and nothing lost. Bounded: a 3-cell scenario on the tiny random
model, three seeds."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kvmap.bench.store import RunStore

TASKS_PY = '''
def probe(llm, tokens=6):
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
    per_cell = {c["cell_id"]: (c["status"], c["metrics"].get("accuracy"),
                               c["metrics"].get("tokens")) for c in cells}
    assert len(per_cell) == len(cells), "a cell is duplicated"
    tokens = sorted((r["cell_id"], r["request_id"], r["output_text"],
                     r["num_output_tokens"]) for r in rows)
    return per_cell, tokens


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("killresume")
    (folder / "tasks.py").write_text(TASKS_PY)
    (folder / "s.yaml").write_text(textwrap.dedent(SCENARIO))
    return folder


@pytest.fixture(scope="module")
def uninterrupted(folder):
    out = folder / "clean"
    start_s = time.monotonic()
    done = subprocess.run(bench_cmd(folder, out), capture_output=True, text=True, env=env(),
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    per_cell, tokens = summary(out)
    assert len(per_cell) == 3 and all(s == "ok" for s, _, _ in per_cell.values())
    return per_cell, tokens, time.monotonic() - start_s


@pytest.mark.parametrize("seed", SEEDS)
def test_kill_9_then_resume_equals_an_uninterrupted_run(seed, folder, uninterrupted):
    expected_cells, expected_tokens, duration_s = uninterrupted
    out = folder / f"killed-{seed}"
    kill_at_s = random.Random(seed).uniform(0.5, 0.9 * duration_s)
    proc = subprocess.Popen(bench_cmd(folder, out), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env())
    try:
        proc.wait(timeout=kill_at_s)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    done = subprocess.run(bench_cmd(folder, out), capture_output=True, text=True, env=env(),
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    cells, tokens = summary(out)
    assert cells == expected_cells
    assert tokens == expected_tokens
