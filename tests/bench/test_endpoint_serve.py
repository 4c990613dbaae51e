"""The happy path on a real second process: the runner launches ``kvmap serve`` on the
tiny random-weight model, runs a load sweep and ``prompt_ppl`` on it beside an in-process
cell, stops it, and the report draws the endpoint like a configuration. Its prompt
perplexity equals the in-process figure computed the same way (one prefill, same KV
configuration, same weights)."""
from __future__ import annotations

import math
import subprocess

import pytest
import yaml

from kvmap.runs.record import CellRecord
from kvmap.bench.runner import run_scenario
from kvmap.bench.scenario import load_scenario

SERVE = ("{python} -m kvmap.cli serve --model dummy:tiny --dtype fp32 --kv fp32 "
         "--kv-memory 1MiB --served-model-name tiny --port {port}")
TASK_PARAMS = {"context_tokens": 48, "num_samples": 2}


@pytest.fixture(scope="module")
def served_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("endpoint-serve")
    scenario = {
        "models": ["dummy:tiny"], "kv": ["fp32"], "cell_timeout_s": 180,
        "engine": {"kv_memory": "1MiB"},
        "endpoints": [{"name": "served", "model": "tiny", "tokenizer": "bytes",
                       "kv_label": "kvmap serve fp32", "kv_memory": "1MiB",
                       "launch": SERVE}],
        "workloads": [{"name": "throughput", "num_requests": 4, "prompt_len": 12,
                       "output_len": 24, "arrival": ["closed:1", "closed:2"]}],
        "tasks": [{"name": "prompt_ppl", "params": TASK_PARAMS},
                  {"name": "passkey", "params": {"context_tokens": [384], "depths": [0.5],
                                                 "num_samples": 1}},
                  {"name": "generation", "params": {"context_tokens": 24, "num_samples": 2,
                                                    "continuation_tokens": 6}}],
    }
    path = base / "served.yaml"
    path.write_text(yaml.safe_dump(scenario))
    result = run_scenario(load_scenario(path), base / "run", show_progress=False)
    return base / "run", result


def test_the_launched_server_answers_workloads_with_the_in_process_keys(served_run):
    _, result = served_run
    cells = [c for c in result.cells if c.kv == "served"]
    assert [c.status for c in cells] == ["ok"] * 5, [c.error for c in cells]
    loads = [c.load["label"] for c in cells if c.workload]
    assert loads == ["closed:1", "closed:2"]
    own = next(c for c in result.cells if c.kv == "fp32")
    for c in cells[:2]:
        m = c.metrics
        assert m["num_completed"] == 4 and m["kv_capacity_bytes"] == 1 << 20
        for key in ("ttft_s", "tbt_s", "tpot_s", "e2e_s", "duration_s"):
            assert key in m and key in own.metrics, key
        assert m["endpoint"]["label"] == "served (kvmap serve fp32)"
        # a sampled gauge: a cell between two scrapes has no reading, and says so
        if m["peak_kv_resident_bytes"] is None:
            assert "read 0 at every scrape" in m["kv_memory_note"]
        else:
            assert m["kv_memory_source"] == "vllm:kv_cache_usage_perc x kv_memory"
            assert 0 < m["peak_kv_resident_bytes"] <= 1 << 20
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert "--served-model-name tiny --port" not in out       # stopped after its cells


def test_prompt_perplexity_equals_the_in_process_figure(served_run):
    from kvmap import LLM
    from kvmap.evals import EvalOptions, get_task
    from kvmap.loadgen.prompts import load_tokenizer
    _, result = served_run
    served = next(c for c in result.cells if c.task == "prompt_ppl" and c.kv == "served")
    assert served.metrics["ppl_definition"] == "prompt_logprobs"
    llm = LLM(model="dummy:tiny", dtype="fp32", kv="fp32", kv_memory="1MiB", device="cpu")
    task = get_task("prompt_ppl", EvalOptions(context_tokens=(48,), num_samples=2))
    mine = task.run(llm, task.prepare(load_tokenizer("bytes"))).metrics["ppl"]
    assert math.isclose(served.metrics["ppl"], mine, rel_tol=1e-3)
    ids = [r["sample_id"] for r in served.details["per_sample"]]
    assert ids == ["prompt_ppl/48/0", "prompt_ppl/48/1"]


def test_retrieval_tasks_run_by_completions(served_run):
    """Random weights answer nothing right; what is checked is that the grid ran over
    HTTP: one sample, its prompt as long as asked, an answer judged."""
    _, result = served_run
    cell = next(c for c in result.cells if c.task == "passkey" and c.kv == "served")
    (sample,) = cell.details["per_sample"]
    assert isinstance(sample["correct"], bool) and isinstance(sample["output"], str)
    assert 300 < sample["num_prompt_tokens"] <= 384 + 8
    assert cell.metrics["num_samples"] == 1 and cell.metrics["grid"]


def test_the_report_draws_the_endpoint_beside_the_configurations(served_run):
    from kvmap.report.analysis import analyze
    from kvmap.report.html import write_report
    from kvmap.report.loader import load_run
    run_dir, _ = served_run
    analysis = analyze(load_run(run_dir))
    by_name = {c.name.split(": ", 1)[-1]: c for c in analysis.configs}
    served = by_name["served (kvmap serve fp32)"]
    assert served.endpoint is not None and served.endpoint.name == "served"
    assert served.peak_kv_bytes is not None or served.memory_note
    assert served.curves["throughput"] and by_name["fp32"].curves["throughput"]
    assert served.tasks["prompt_ppl"].value == pytest.approx(
        next(c for c in analysis.run.cells if c.task == "prompt_ppl").metrics["ppl"])
    html = write_report(analysis).read_text()
    assert "served (kvmap serve fp32)" in html


GENERATION = {"context_tokens": (24,), "num_samples": 2, "continuation_tokens": 6}


@pytest.fixture(scope="module")
def in_process():
    """``{kv: {task: TaskRun}}`` of the same tasks in-process on the same weights (a dummy
    model's task cells are not run by the bench, so they are run here)."""
    from kvmap import LLM
    from kvmap.evals import EvalOptions, get_task
    from kvmap.loadgen.prompts import load_tokenizer
    out = {}
    for kv in ("fp32", "int8"):
        llm = LLM(model="dummy:tiny", dtype="fp32", kv=kv, kv_memory="1MiB", device="cpu")
        llm.tokenizer = load_tokenizer("bytes")
        runs = {}
        for name, options in (("prompt_ppl", {"context_tokens": (48,), "num_samples": 2}),
                              ("generation", GENERATION)):
            task = get_task(name, EvalOptions(**options))
            runs[name] = task.run(llm, task.prepare(llm.tokenizer))
        out[kv] = runs
    return out


def _served(result, task: str) -> dict:
    return next(c for c in result.cells if c.task == task and c.kv == "served")


def test_the_endpoints_top_k_equals_the_in_process_one(served_run, in_process):
    """Same weights, same KV configuration: the top-5 strings and log-probabilities the
    server returns at every prompt position are the ones prompt_ppl computes in-process,
    so KL over the returned top-k is 0 and top-1 agreement 1; int8's KL is not 0. The
    report computes the same from the cells and says what it is."""
    from kvmap.evals.topk import KL_DEFINITION, topk_comparison
    from kvmap.report.table import task_cell
    from kvmap.report.tasks import task_result
    _, result = served_run
    served = _served(result, "prompt_ppl")
    own, int8 = in_process["fp32"]["prompt_ppl"], in_process["int8"]["prompt_ppl"]
    for m in (own.metrics, served.metrics):
        assert m["kl_definition"] == KL_DEFINITION and m["num_top_logprobs"] == 5
    for a, b in zip(own.per_sample, served.details["per_sample"]):
        # bytes >= 128 all decode to "\ufffd": the most likely of them stands for them
        assert len(a["top_logprobs"]) == 47 and all(1 <= len(t) <= 5 for t in a["top_logprobs"])
        for x, y in zip(a["top_logprobs"], b["top_logprobs"]):
            assert list(x) == list(y)
            assert list(x.values()) == pytest.approx(list(y.values()), abs=1e-5)
    same = topk_comparison(served.details["per_sample"], own.per_sample)
    assert same["kl_topk"] < 1e-6 and same["top1_topk"] == 1.0 and same["num_samples"] == 2
    other = topk_comparison(int8.per_sample, own.per_sample)
    assert other["kl_topk"] > 0
    lo, hi = other["kl_topk_ci95"]
    assert lo <= other["kl_topk"] <= hi
    base = CellRecord(cell_id="own", kind="task", model="m", dtype="fp32", kv="fp32",
                      task="prompt_ppl", task_kind="ppl", metrics=own.metrics,
                      details={"per_sample": own.per_sample})
    figures = task_result(served, base).topk
    assert figures["kl_topk"] == same["kl_topk"] and figures["top1_topk"] == 1.0
    assert "over the returned top-5" in task_cell(task_result(served, base), False)


def test_generation_runs_over_http_and_agrees_with_the_in_process_outputs(served_run,
                                                                          in_process):
    """generation (greedy, fixed length) over completions: the server's output ids are
    the in-process ones, compared from the stored records as the report does."""
    from kvmap.evals.generation import record_agreement
    from kvmap.report.tasks import task_result
    _, result = served_run
    served = _served(result, "generation")
    own = in_process["fp32"]["generation"]
    mine = served.details["per_sample"]
    assert [r["num_output_tokens"] for r in mine] == [6, 6]
    assert all(r["e2e_s"] > 0 for r in mine)
    assert [r["output_ids"] for r in mine] == [r["output_ids"] for r in own.per_sample]
    figures = record_agreement(mine, own.per_sample)
    assert figures["exact_match"] == 1.0 and figures["first_divergence"] == [6, 6]
    base = CellRecord(cell_id="own", kind="task", model="m", dtype="fp32", kv="fp32",
                      task="generation", task_kind="other", metrics=own.metrics,
                      details={"per_sample": own.per_sample})
    assert task_result(served, base).agreement["exact_match"] == 1.0
