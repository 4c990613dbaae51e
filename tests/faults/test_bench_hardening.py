"""Bench runs that must not hang, leak, race or hide faults: the run-directory lock, rich
markup in errors, scenario names, changed input files, cell limits (default timeout,
process-group kill, memory cap), trace arrivals, and tier errors in the record and the
checklist. Cells run on the tiny random model."""
from __future__ import annotations

import io
import os
import textwrap
import time

import pytest
from rich.console import Console

from kvmap.bench.runner import run_scenario
from kvmap.bench.cellspec import DEFAULT_CELL_TIMEOUT_S
from kvmap.bench.scenario import ScenarioError, load_scenario
from kvmap.runs.store import RunLock, RunStore

TASKS_PY = '''
import os, subprocess, sys, time

def markup(llm):
    raise RuntimeError("bad [/] markup [bold]here[/bold] and [/nope]")

def spawn_and_hang(llm, pid_file=""):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open(pid_file, "w").write(str(child.pid))
    time.sleep(600)

def hang(llm):
    time.sleep(600)

def oom_score(llm):
    return {"oom_score_adj": int(open("/proc/self/oom_score_adj").read())}

def hog(llm, gib=3):
    import numpy     # an untouched allocation: address space, no resident memory
    return {"n": int(numpy.empty(gib << 30, numpy.uint8).size)}
'''
HEAD = """
    models: [dummy:tiny]
    engine: {kv_memory: 1MiB, block_size: 4, max_num_batched_tokens: 64}
    """
WORKLOAD = """
    workloads:
      - {name: tp, kind: synthetic, num_requests: 2, prompt_len: 8, output_len: 2}
    """


def scenario(tmp_path, body: str, name: str = "s.yaml"):
    (tmp_path / "tasks.py").write_text(TASKS_PY)
    path = tmp_path / name
    path.write_text(textwrap.dedent(HEAD) + textwrap.dedent(body))
    return load_scenario(path)


def run(s, out):
    text = io.StringIO()
    result = run_scenario(s, out, console=Console(file=text, width=200), show_progress=False)
    return result, text.getvalue()


def test_rich_markup_in_an_error_does_not_crash_the_runner(tmp_path):
    s = scenario(tmp_path, 'tasks:\n  - {name: m, task: "tasks.py:markup"}\n')
    result, text = run(s, tmp_path / "run")
    (cell,) = result.cells
    assert cell.status == "failed" and "[/nope]" in cell.error
    assert "[/] markup" in text and result.num_failed == 1


def test_a_second_run_on_the_same_out_is_refused_naming_the_holder(tmp_path):
    s = scenario(tmp_path, WORKLOAD)
    with RunLock(tmp_path / "run"):
        with pytest.raises(ValueError, match=f"in use by another run \\(pid {os.getpid()}"):
            run(s, tmp_path / "run")
    result, _ = run(s, tmp_path / "run")          # released: the run goes ahead
    assert [c.status for c in result.cells] == ["ok"]


@pytest.mark.parametrize("name", ["../escape", "a/b", ".hidden", "..\\\\x"])
def test_scenario_names_that_leave_runs_are_refused(tmp_path, name):
    with pytest.raises(ScenarioError, match="plain name"):
        scenario(tmp_path, f"name: {name!r}\n" + textwrap.dedent(WORKLOAD))


def test_resume_after_an_input_file_changed_is_refused(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(" ".join(f"Sentence {i} about caches." for i in range(200)))
    body = ("workloads:\n  - {name: c, kind: synthetic, num_requests: 1, prompt_len: 8, "
            "output_len: 2, corpus: corpus.txt}\n")
    s = scenario(tmp_path, body)
    run(s, tmp_path / "run")
    assert str(corpus.resolve()) in RunStore(tmp_path / "run").metadata()["input_files"]
    run(s, tmp_path / "run")                         # unchanged: resumes (nothing to do)
    corpus.write_text(corpus.read_text().replace("caches", "hashes"))
    with pytest.raises(ValueError, match="corpus.txt"):
        run(scenario(tmp_path, body), tmp_path / "run")


def test_cells_have_a_default_timeout_and_far_trace_arrivals_are_refused(tmp_path):
    s = scenario(tmp_path, WORKLOAD)
    assert s.cell_timeout_s == DEFAULT_CELL_TIMEOUT_S
    assert all(c.timeout_s == DEFAULT_CELL_TIMEOUT_S for c in s.cells())
    (tmp_path / "t.jsonl").write_text('{"arrival_s": 0.0, "prompt_tokens": 8, "max_tokens": 2}\n'
                                      '{"arrival_s": 1e7, "prompt_tokens": 8, "max_tokens": 2}\n')
    with pytest.raises(ScenarioError, match="past cell_timeout_s"):
        scenario(tmp_path, "workloads:\n  - {name: r, kind: trace, trace: t.jsonl}\n")


def test_a_timed_out_cell_takes_its_children_with_it(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    s = scenario(tmp_path, f"cell_timeout_s: 6\ntasks:\n  - {{name: h, task: "
                           f"\"tasks.py:spawn_and_hang\", params: {{pid_file: {str(pid_file)!r}}}}}\n")
    result, _ = run(s, tmp_path / "run")
    (cell,) = result.cells
    assert cell.status == "failed" and "timed out" in cell.error
    pid = int(pid_file.read_text())
    for _ in range(50):                              # the kill is asynchronous
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"grandchild {pid} survived the cell's timeout")


def test_a_killed_cells_tier_storage_is_swept(tmp_path):
    disk_path = tmp_path / "kv"
    s = scenario(tmp_path, f"cell_timeout_s: 6\n"
                           f"kv: [\"fp32+tiers(disk=1MiB,disk_path={disk_path})\"]\n"
                           'tasks:\n  - {name: h, task: "tasks.py:hang"}\n')
    result, _ = run(s, tmp_path / "run")
    assert "timed out" in result.cells[0].error
    assert list(disk_path.iterdir()) == []        # the dead cell's kvmap-disk-<pid>-* dir


def test_the_cell_is_the_oom_killers_first_choice(tmp_path):
    s = scenario(tmp_path, 'tasks:\n  - {name: o, task: "tasks.py:oom_score"}\n')
    result, _ = run(s, tmp_path / "run")
    assert result.cells[0].metrics["oom_score_adj"] == 1000


def test_cell_memory_limit_fails_the_cell_not_the_machine(tmp_path):
    """A 3 GiB allocation (address space only: never touched) succeeds in a cell
    without a cap on any machine this suite runs on, and fails under a 2 GiB cap: the
    cap, not the machine, stops it (a 64 GiB one failed on a 24 GiB machine either way)."""
    task = 'tasks:\n  - {name: hog, task: "tasks.py:hog"}\n'
    free = run(scenario(tmp_path, task, "free.yaml"), tmp_path / "free")[0]
    assert [(c.status, c.metrics.get("n")) for c in free.cells] == [("ok", 3 << 30)]
    s = scenario(tmp_path, "cell_memory_limit: 2GiB\n" + task)
    assert all(c.memory_limit_bytes == 2 << 30 for c in s.cells())
    result, _ = run(s, tmp_path / "run")
    (cell,) = result.cells
    assert cell.status == "failed" and "MemoryError" in cell.error


def test_tier_errors_reach_the_record_and_the_checklist(tmp_path):
    from kvmap.report.analysis import analyze
    from kvmap.report.loader import load_run
    s = scenario(tmp_path, 'kv: ["fp32+tiers(redis=redis://127.0.0.1:1/0,fetch=always)"]\n'
                           "engine: {kv_memory: 16KiB, block_size: 4, max_num_batched_tokens: 64}\n"
                           "workloads:\n  - {name: tp, kind: synthetic, num_requests: 8, "
                           "prompt_len: 24, output_len: 2}\n")
    result, _ = run(s, tmp_path / "run")
    (cell,) = result.cells
    assert cell.status == "ok" and cell.metrics["tier_errors"] > 0
    assert any(w.startswith("TierErrors:") and "redis:connection" in w
               for w in cell.warnings)
    items = [i for items in analyze(load_run(tmp_path / "run")).checklist.values()
             for i in items if i.item.startswith("tier errors")]
    assert [i.status for i in items] == ["FAIL"]      # Redis down throughout: no tier hit


def test_input_files_name_the_task_module_and_the_trace(tmp_path):
    from kvmap.runs.inputs import changed_files, input_files
    (tmp_path / "t.jsonl").write_text('{"arrival_s": 0.0, "prompt_tokens": 8, "max_tokens": 2}\n')
    s = scenario(tmp_path, 'tasks:\n  - {name: o, task: "tasks.py:oom_score"}\n'
                           "workloads:\n  - {name: r, kind: trace, trace: t.jsonl}\n")
    files = input_files(s)
    assert {str((tmp_path / n).resolve()) for n in ("tasks.py", "t.jsonl")} <= set(files)
    (tmp_path / "tasks.py").write_text(TASKS_PY + "\n# edited\n")
    assert changed_files(files, input_files(s)) == [str((tmp_path / "tasks.py").resolve())]
