"""The Ray backend of ``kvmap bench``: a two-cell scenario on a local Ray instance finds
the same results as the local backend; resume, failed and timed-out cells, Ctrl-C; the
resources each cell declares; and Ray staying optional (no import, a clear error).

One Ray instance (2 CPUs, a 200 MiB object store) serves every test of this module that
needs one; the cells use the tiny random model ``dummy:tiny``."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import typer
from typer.testing import CliRunner

from kvmap.bench.command import register
from kvmap.report.command import bench_tradeoff_map
from kvmap.bench.runner import run_scenario
from kvmap.bench.scenario import CellSpec, ModelEntry, TaskEntry, load_scenario
from kvmap.config import EngineArgs as EngineSettings
from kvmap.runs.store import RunStore

TASKS_PY = '''
import time

def ppl_probe(llm, context=16, continuation=8):
    """Teacher-forced perplexity of a fixed token sequence through the KV cache, and the
    greedy continuation of its context (the model has no tokenizer: token ids, no text)."""
    from kvmap import SamplingParams
    from kvmap.evals.ppl import log_probs, perplexity, token_nll
    ids = [(7 * i + 3) % 200 + 3 for i in range(context + continuation)]
    nll = token_nll(log_probs(llm.engine.score(ids, num_context_tokens=context)),
                    ids[context:])
    out = llm.generate([ids[:context]], SamplingParams(max_tokens=6, temperature=0))[0]
    return {"ppl": perplexity(nll), "nll_mean": float(nll.mean()), "n": len(ids),
            "output_ids": list(out.token_ids)}

def boom(llm):
    raise RuntimeError("boom: this task always fails")

def sleepy(llm, seconds=60):
    time.sleep(seconds)
    return {}
'''

ENGINE = "engine: {kv_memory: 1MiB, block_size: 4, max_num_batched_tokens: 64, num_threads: 1}"
TWO_CELLS = f"""
    name: two-cells
    models: ["dummy:tiny"]
    {ENGINE}
    kv: [int8]
    workloads:
      - {{name: tp, kind: synthetic, num_requests: 3, prompt_len: 12, output_len: 4,
          arrival: "closed:2"}}
    tasks:
      - {{name: ppl, task: "my_tasks.py:ppl_probe"}}
    """
# Deterministic metrics: token counts, what was computed. Not timings.
DETERMINISTIC = ("num_completed", "num_failed", "num_output_tokens", "num_prompt_tokens",
                 "kv_bytes_per_token", "kv_capacity_bytes", "num_kv_blocks",
                 "max_num_running_seqs", "ppl", "nll_mean", "n", "output_ids")


def write_scenario(tmp_path, body: str, name: str = "s.yaml"):
    (tmp_path / "my_tasks.py").write_text(TASKS_PY)
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


@pytest.fixture(scope="module")
def ray_instance():
    """One small local Ray instance for the module; a backend finding Ray already
    initialized uses it and leaves it running."""
    ray = pytest.importorskip("ray")
    import logging
    ray.init(num_cpus=2, object_store_memory=200 * 2**20, include_dashboard=False,
             logging_level=logging.ERROR, log_to_driver=False)
    yield ray
    ray.shutdown()


def comparable(store: RunStore) -> dict:
    """cell id -> (status, deterministic metrics, per-request output texts and counts)."""
    rows = store.requests().to_pylist()
    out = {}
    for cell in store.cells():
        metrics = {k: v for k, v in cell.metrics.items() if k in DETERMINISTIC}
        requests = sorted((r["request_id"], r["output_text"], r["num_prompt_tokens"],
                           r["num_output_tokens"], r["finish_reason"])
                          for r in rows if r["cell_id"] == cell.cell_id)
        out[cell.cell_id] = (cell.status, cell.kind, cell.kv, metrics, requests)
    return out


def test_ray_backend_finds_the_local_results(tmp_path, ray_instance):
    scenario = load_scenario(write_scenario(tmp_path, TWO_CELLS))
    assert len(scenario.cells()) == 2
    local = run_scenario(scenario, tmp_path / "local", show_progress=False)
    on_ray = run_scenario(scenario, tmp_path / "ray", show_progress=False, backend="ray")
    assert local.num_failed == 0, [c.error for c in local.cells]
    assert on_ray.num_ran == 2 and on_ray.num_failed == 0, [c.error for c in on_ray.cells]

    a, b = comparable(RunStore(tmp_path / "local")), comparable(RunStore(tmp_path / "ray"))
    assert list(a) == [c.cell_id for c in scenario.cells()] == list(b)
    assert a == b
    ppl = next(v for v in b.values() if v[1] == "task")[3]
    assert ppl["ppl"] > 1 and ppl["n"] == 24 and len(ppl["output_ids"]) == 6
    tp = next(v for v in b.values() if v[1] == "workload")
    assert tp[3]["num_output_tokens"] == 12 and len(tp[4]) == 3
    # the comparison can fail: the same task through another KV codec scores otherwise
    other = run_scenario(load_scenario(write_scenario(tmp_path, f"""
        models: ["dummy:tiny"]
        {ENGINE}
        kv: [int4]
        tasks: [{{name: ppl, task: "my_tasks.py:ppl_probe"}}]
        """, "int4.yaml")), tmp_path / "int4", show_progress=False, backend="ray")
    assert other.cells[0].metrics["ppl"] != ppl["ppl"]

    store = RunStore(tmp_path / "ray")
    assert store.metadata()["backend"]["name"] == "ray"
    assert store.metadata()["backend"]["num_cpus"] == 2
    assert all(c.env["backend"] == "ray" and c.env["node"] for c in store.cells())
    assert all(store.log_path(c.cell_id).is_file() for c in store.cells())
    assert not (tmp_path / "ray" / ".work").exists()
    assert ray_instance.is_initialized()                   # not ours: left running


def test_ray_resume_failure_and_timeout(tmp_path, ray_instance):
    path = write_scenario(tmp_path, f"""
        models: ["dummy:tiny"]
        {ENGINE}
        kv: [fp32]
        cell_timeout_s: 20
        tasks:
          - {{name: ppl, task: "my_tasks.py:ppl_probe"}}
          - {{name: broken, task: "my_tasks.py:boom"}}
          - {{name: slow, task: "my_tasks.py:sleepy"}}
        """)
    scenario = load_scenario(path)
    out = tmp_path / "run"
    # the first cell done by the local backend, then interrupted ...
    ppl_cell = scenario.cells()[0]
    from kvmap.bench.backends import LocalBackend, run_cell_process

    class FirstOnly(LocalBackend):
        def run(self, todo, store, on_fraction):
            yield from super().run(todo[:1], store, on_fraction)
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_scenario(scenario, out, show_progress=False, backend=FirstOnly(run_cell_process))
    assert [c.cell_id for c in RunStore(out).cells()] == [ppl_cell.cell_id]

    # ... resumed on Ray: the two others run there; both fail, and are stored
    t0 = time.perf_counter()
    result = run_scenario(scenario, out, show_progress=False, backend="ray")
    assert result.resumed and result.num_skipped == 1 and result.num_ran == 2
    by_task = {c.task: c for c in result.cells}
    assert [c.task for c in result.cells] == ["ppl", "broken", "slow"]   # scenario order
    assert by_task["ppl"].status == "ok" and by_task["ppl"].env["backend"] == "local"
    assert by_task["broken"].status == "failed"
    assert "boom: this task always fails" in by_task["broken"].error
    assert by_task["slow"].status == "failed"
    assert "timed out after 20 s" in by_task["slow"].error
    assert time.perf_counter() - t0 < 60
    assert RunStore(out).metadata()["interrupted"] is False


def _cell_processes(cell_id: str) -> list[int]:
    import psutil
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or ())
        if "kvmap.bench.cell" in cmd and cell_id in cmd:
            found.append(proc.info["pid"])
    return found


@pytest.fixture
def ctrl_c_raises():
    """Python's own SIGINT handler for the test, as a terminal gives ``kvmap bench``.
    A process started with SIGINT ignored (a background job of a non-interactive
    shell, which is how CI may start the suite) keeps SIG_IGN: Python installs
    ``default_int_handler`` only over SIG_DFL, so no KeyboardInterrupt could come."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_cancels_ray_cells(tmp_path, ray_instance, ctrl_c_raises):
    scenario = load_scenario(write_scenario(tmp_path, f"""
        models: ["dummy:tiny"]
        {ENGINE}
        tasks: [{{name: slow, task: "my_tasks.py:sleepy", params: {{seconds: 120}}}}]
        """))
    (cell,) = scenario.cells()
    main = threading.main_thread().ident
    seen: list[int] = []

    def interrupt_when_running():
        deadline = time.monotonic() + 60
        while not seen and time.monotonic() < deadline:
            seen.extend(_cell_processes(cell.cell_id))
            time.sleep(0.2)
        signal.pthread_kill(main, signal.SIGINT)

    threading.Thread(target=interrupt_when_running, daemon=True).start()
    t0 = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        run_scenario(scenario, tmp_path / "run", show_progress=False, backend="ray")
    assert seen and time.perf_counter() - t0 < 60         # interrupted while it ran
    assert RunStore(tmp_path / "run").cells() == []
    assert RunStore(tmp_path / "run").metadata()["interrupted"] is True
    deadline = time.monotonic() + 10
    while _cell_processes(cell.cell_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _cell_processes(cell.cell_id) == []             # the cell process was killed


def test_cells_no_node_can_hold_are_refused(tmp_path, ray_instance):
    for engine, expected in (("{num_threads: 64}", "needs 64 CPU(s)"),
                             ("{device: cuda}", "has no GPU")):
        scenario = load_scenario(write_scenario(tmp_path, f"""
            models: ["dummy:tiny"]
            engine: {engine}
            tasks: [{{name: p, task: "my_tasks.py:ppl_probe"}}]
            """))
        with pytest.raises(ValueError, match=re.escape(expected)):
            run_scenario(scenario, tmp_path / "run", show_progress=False, backend="ray")
        assert not (tmp_path / "run").exists()               # refused before storing


def test_a_cancelled_task_is_interrupted_where_sigint_was_ignored():
    """Ray cancels a running task with ``_thread.interrupt_main``, a no-op under SIG_IGN
    (a worker of a driver started as a background job): the task body restores
    Python's handler while it runs, and SIG_IGN after."""
    import _thread
    from kvmap.bench.ray_backend import _cancellable
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _thread.interrupt_main()           # ignored: nothing happens
        time.sleep(0.01)
        with pytest.raises(KeyboardInterrupt), _cancellable():
            _thread.interrupt_main()
            time.sleep(1.0)                  # the interrupt lands here
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_declared_resources():
    from kvmap.bench.ray_backend import cell_resources
    from kvmap.config import parse_size

    def cell(**engine) -> CellSpec:
        return CellSpec("c", ModelEntry("dummy:tiny", "fp32"), "fp32",
                        EngineSettings(kv_memory="64MiB", **engine), 0,
                        task=TaskEntry("p", "m:f"))

    cpu = cell_resources(cell(), cluster_has_gpu=False)
    assert cpu["num_cpus"] == 1 and cpu["num_gpus"] == 0
    assert cpu["memory"] > parse_size("64MiB")               # the KV pool, and more
    assert cell_resources(cell(num_threads=4), False)["num_cpus"] == 4
    assert cell_resources(cell(device="cuda"), True)["num_gpus"] == 1
    assert cell_resources(cell(), cluster_has_gpu=True)["num_gpus"] == 1   # engine default
    assert cell_resources(cell(device="cpu"), cluster_has_gpu=True)["num_gpus"] == 0
    gpu = cell_resources(cell(device="cuda"), True)
    assert gpu["memory"] == cpu["memory"] - parse_size("64MiB")  # the pool is on the GPU
    unknown = CellSpec("c", ModelEntry("/no/such/model.gguf"), "bf16", EngineSettings(), 0,
                       task=TaskEntry("p", "m:f"))
    assert "memory" not in cell_resources(unknown, False)


def _app() -> typer.Typer:
    app = typer.Typer()
    app.callback()(lambda: None)
    register(app, tradeoff_map=bench_tradeoff_map)
    return app


def test_without_ray_a_clear_error(tmp_path, monkeypatch):
    path = write_scenario(tmp_path, TWO_CELLS)
    monkeypatch.setitem(sys.modules, "ray", None)            # `import ray` fails
    result = CliRunner().invoke(_app(), ["bench", str(path), "--backend", "ray",
                                         "--out", str(tmp_path / "run")])
    assert result.exit_code == 2, result.output
    assert "pip install 'kvmap[ray]'" in result.output and "error:" in result.output
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("args, expected", [
    (["--backend", "spark"], "unknown backend 'spark'; valid backends: local, ray"),
    (["--address", "10.0.0.1:6379"], "--address '10.0.0.1:6379' needs --backend ray"),
])
def test_bad_backend_options(tmp_path, args, expected):
    path = write_scenario(tmp_path, TWO_CELLS)
    result = CliRunner().invoke(_app(), ["bench", str(path), *args])
    assert result.exit_code == 2 and expected in result.output, result.output


def test_unreachable_address_fails_fast(tmp_path):
    pytest.importorskip("ray")
    import socket
    with socket.socket() as sock:                            # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    path = write_scenario(tmp_path, TWO_CELLS)
    t0 = time.perf_counter()
    result = CliRunner().invoke(_app(), ["bench", str(path), "--backend", "ray", "--address",
                                         f"127.0.0.1:{port}", "--out", str(tmp_path / "run")])
    assert result.exit_code == 2, result.output
    assert f"cannot reach the Ray cluster at '127.0.0.1:{port}'" in result.output
    assert time.perf_counter() - t0 < 30 and not (tmp_path / "run").exists()


def test_kvmap_does_not_import_ray():
    code = ("import sys, kvmap, kvmap.cli, kvmap.bench.runner, kvmap.bench.command, "
            "kvmap.bench.backends\n"
            "from kvmap.bench.backends import make_backend\n"
            "make_backend('local')\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'ray')))")
    out = subprocess.run([sys.executable, "-c", "import json\n" + code], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
