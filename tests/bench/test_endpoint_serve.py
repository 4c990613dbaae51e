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
        "tasks": [{"name": "prompt_ppl", "params": TASK_PARAMS}],
    }
    path = base / "served.yaml"
    path.write_text(yaml.safe_dump(scenario))
    result = run_scenario(load_scenario(path), base / "run", show_progress=False)
    return base / "run", result


def test_the_launched_server_answers_workloads_with_the_in_process_keys(served_run):
    _, result = served_run
    cells = [c for c in result.cells if c["kv"] == "served"]
    assert [c["status"] for c in cells] == ["ok"] * 3, [c.get("error") for c in cells]
    loads = [c["load"]["label"] for c in cells if c["workload"]]
    assert loads == ["closed:1", "closed:2"]
    own = next(c for c in result.cells if c["kv"] == "fp32")
    for c in cells[:2]:
        m = c["metrics"]
        assert m["num_completed"] == 4 and m["kv_capacity_bytes"] == 1 << 20
        for key in ("ttft_s", "tbt_s", "tpot_s", "e2e_s", "duration_s"):
            assert key in m and key in own["metrics"], key
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
    served = next(c for c in result.cells if c["task"] == "prompt_ppl")
    assert served["metrics"]["ppl_definition"] == "prompt_logprobs"
    llm = LLM(model="dummy:tiny", dtype="fp32", kv="fp32", kv_memory="1MiB", device="cpu")
    task = get_task("prompt_ppl", EvalOptions(context_tokens=(48,), num_samples=2))
    mine = task.run(llm, task.prepare(load_tokenizer("bytes"))).metrics["ppl"]
    assert math.isclose(served["metrics"]["ppl"], mine, rel_tol=1e-3)
    ids = [r["sample_id"] for r in served["details"]["per_sample"]]
    assert ids == ["prompt_ppl/48/0", "prompt_ppl/48/1"]


def test_the_report_draws_the_endpoint_beside_the_configurations(served_run):
    from kvmap.report.analysis import analyze
    from kvmap.report.html import write_report
    from kvmap.report.loader import load_run
    run_dir, _ = served_run
    analysis = analyze(load_run(run_dir))
    by_name = {c.name.split(": ", 1)[-1]: c for c in analysis.configs}
    served = by_name["served (kvmap serve fp32)"]
    assert served.endpoint["name"] == "served"
    assert served.peak_kv_bytes is not None or served.memory_note
    assert served.curves["throughput"] and by_name["fp32"].curves["throughput"]
    assert served.tasks["prompt_ppl"].value == pytest.approx(
        next(c for c in analysis.run.cells if c["task"] == "prompt_ppl")["metrics"]["ppl"])
    html = write_report(analysis).read_text()
    assert "served (kvmap serve fp32)" in html
