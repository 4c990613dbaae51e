"""CI's endpoint run (``tests/bench/scenarios/endpoint-ci.yaml``): ``kvmap serve`` on the
embedded model, launched by the runner as a real second process, beside the same KV
configuration in-process; the report draws both, and the endpoint's prompt-log-probability
perplexity equals the in-process one computed the same way within 1e-3 relative."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from kvmap.bench.runner import run_scenario
from kvmap.bench.scenario import load_scenario

SCENARIO = Path(__file__).with_name("scenarios") / "endpoint-ci.yaml"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("endpoint-ci") / "run"
    return run_dir, run_scenario(load_scenario(SCENARIO), run_dir, show_progress=False)


def test_every_cell_ran(ci_run):
    _, result = ci_run
    assert [(c["kv"], c["workload"] or c["task"], c["status"]) for c in result.cells] == [
        ("bf16", "throughput", "ok"), ("bf16", "prompt_ppl", "ok"),
        ("kvmap-serve", "throughput", "ok"), ("kvmap-serve", "prompt_ppl", "ok")], \
        [c.get("error") for c in result.cells]


def test_prompt_perplexity_of_the_endpoint_equals_the_in_process_figure(ci_run):
    _, result = ci_run
    own, served = [c for c in result.cells if c["task"] == "prompt_ppl"]
    for c in (own, served):
        assert c["metrics"]["ppl_definition"] == "prompt_logprobs"
        assert c["metrics"]["num_tokens_scored"] == 2 * 255
    assert math.isclose(served["metrics"]["ppl"], own["metrics"]["ppl"], rel_tol=1e-3)
    pairs = zip(own["details"]["per_sample"], served["details"]["per_sample"])
    for a, b in pairs:
        assert a["sample_id"] == b["sample_id"]
        assert math.isclose(a["nll_mean"], b["nll_mean"], rel_tol=1e-3)


def test_the_report_draws_the_endpoint_beside_kvmaps_own_configuration(ci_run):
    from kvmap.report.analysis import analyze
    from kvmap.report.html import write_report
    from kvmap.report.loader import load_run
    run_dir, _ = ci_run
    analysis = analyze(load_run(run_dir))
    configs = {c.name: c for c in analysis.configs}
    assert set(configs) == {"bf16", "kvmap-serve (kvmap serve bf16)"}
    served, own = configs["kvmap-serve (kvmap serve bf16)"], configs["bf16"]
    for c in (served, own):
        assert c.throughput_tok_s and c.tbt_p99_s is not None
    # its baseline is kvmap's own bf16 cell of the same task, compared like with like
    drop = served.tasks["prompt_ppl"].drop_pct
    assert drop is not None and abs(drop) < 0.1
    html = write_report(analysis).read_text()
    assert "kvmap-serve (kvmap serve bf16)" in html and "bf16" in html
