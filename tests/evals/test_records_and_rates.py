"""Per-sample records, the intervals that carry the power (Wilson, paired ppl delta), the
negative-sample rate, output-length inflation and cheap retrieval trials, on hand-made
data with known answers and on the tiny model."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from kvmap.config import EngineArgs
from kvmap.evals import EvalOptions, TaskRun, evaluate, get_task
from kvmap.evals.chat_generation import length_metrics, ratios
from kvmap.evals.ppl import token_nll
from kvmap.evals.stats import (accuracy_metrics, negative_rate, paired_values,
                               wilson_interval)
from kvmap.model.byte_tokenizer import ByteTokenizer
from tests.evals.test_evals import tiny_factory


# ---- intervals and rates by hand -----------------------------------------------------
def test_wilson_interval_by_hand():
    # k = 5 of n = 10: centre (5 + 1.92) / 13.84 = 0.5; half 1.96/13.84 * sqrt(2.5 + 0.96)
    low, high = wilson_interval(5, 10)
    half = 1.959964 / (10 + 1.959964 ** 2) * math.sqrt(2.5 + 1.959964 ** 2 / 4)
    assert (low, high) == pytest.approx((0.5 - half, 0.5 + half))
    assert (low, high) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    low, high = wilson_interval(0, 40)            # not a point at 0%, unlike Wald
    assert low == 0.0 and high == pytest.approx(0.0876, abs=1e-4)
    assert wilson_interval(40, 40)[1] == 1.0 and wilson_interval(40, 40)[0] > 0.9
    # the yardstick: 40 trials, +-15 points at 50%, about +-7 at 95%
    low, high = wilson_interval(20, 40)
    assert 0.28 < high - low < 0.31
    low, high = wilson_interval(38, 40)
    assert 0.10 < high - low < 0.20
    for bad in [(1, 0), (3, 2), (-1, 4)]:
        with pytest.raises(ValueError, match="successes"):
            wilson_interval(*bad)


def test_accuracy_metrics_carry_their_interval():
    m = accuracy_metrics([True, True, False, True])
    assert m == {"accuracy": 0.75, "accuracy_ci95": wilson_interval(3, 4), "num_samples": 4,
                 "n": 4}


def test_negative_rate_counts_only_baseline_right_config_wrong():
    baseline = [1, 1, 1, 0, 0, 1, 1, 1, 1, 1]
    config = [1, 0, 1, 1, 1, 0, 1, 1, 1, 1]   # 2 losses, 2 gains: the mean hides them
    rate, ci = negative_rate(config, baseline)
    assert rate == 0.2 and ci == wilson_interval(2, 10)
    assert sum(config) == sum(baseline)
    assert negative_rate(baseline, baseline) == (0.0, wilson_interval(0, 10))


def test_paired_values_pair_by_sample_id_not_by_order():
    mine = [{"sample_id": "b", "correct": False}, {"sample_id": "a", "correct": True}]
    theirs = [{"sample_id": "a", "correct": True}, {"sample_id": "b", "correct": True}]
    assert paired_values(mine, theirs, "correct") == ([0.0, 1.0], [1.0, 1.0])
    with pytest.raises(ValueError, match="ids not in both: \\['b', 'c'\\]"):
        paired_values(mine, [theirs[0], {"sample_id": "c", "correct": True}], "correct")


def test_retrieval_compare_reports_the_negative_rate_against_the_baseline():
    task = get_task("passkey", EvalOptions())
    ids = [f"passkey/1024/0.5/{i}" for i in range(4)]

    def run(correct):
        return TaskRun(accuracy_metrics(correct),
                       [{"sample_id": i, "correct": c} for i, c in zip(ids, correct)])
    m = task.compare(run([True, False, True, True]), run([True, True, False, True]))
    assert m["negative_rate"] == 0.25 and m["negative_rate_ci95"] == wilson_interval(1, 4)
    assert m["delta_accuracy"]["mean"] == 0.0 and m["accuracy_ci95"] == wilson_interval(3, 4)


def test_length_inflation_by_hand():
    def recs(lengths, stops, e2e):
        return [{"sample_id": str(i), "num_output_tokens": n, "finish_reason": f, "e2e_s": t}
                for i, (n, f, t) in enumerate(zip(lengths, stops, e2e))]
    base = length_metrics(recs([10] * 9 + [20], ["stop"] * 10, [1.0] * 10))
    assert base["output_tokens_mean"] == 11.0
    assert base["output_tokens_p90"] == pytest.approx(11.0)      # 10 + 0.1 * (20 - 10)
    assert base["natural_stop_rate"] == 1.0 and base["e2e_s_mean"] == 1.0
    long = length_metrics(recs([22] * 10, ["stop"] * 8 + ["length"] * 2, [2.0] * 10))
    assert long["natural_stop_rate"] == 0.8
    assert long["natural_stop_rate_ci95"] == wilson_interval(8, 10)
    r = ratios(long, base)
    assert r["output_tokens_mean_ratio"] == 2.0 and r["e2e_s_mean_ratio"] == 2.0
    assert r["output_tokens_p90_ratio"] == pytest.approx(2.0)
    assert ratios(long, {})["output_tokens_mean_ratio"] is None


# ---- the CUDA bug: the gather index lives on the log-probs' device --------------------
def test_token_nll_builds_its_index_on_the_logits_device():
    logp = torch.zeros(3, 5, device="meta")       # any non-CPU device stands for CUDA
    assert token_nll(logp, [0, 1, 4]).device.type == "meta"


# ---- records from the tasks on the tiny model -----------------------------------------
def run_tiny(task: str, specs, **options) -> dict:
    return evaluate(task, specs, EvalOptions(**options), engine=EngineArgs(dtype="fp32"),
                    make_llm=tiny_factory())


def test_passkey_records_are_stable_and_the_prefix_cache_serves_shared_text():
    result = run_tiny("passkey", ["fp32", "int2"], context_tokens=(300,),
                      depths=(0.2, 0.5, 0.8), num_samples=2)
    base = result["baseline"]["per_sample"]
    ids = [r["sample_id"] for r in base]
    assert len(set(ids)) == 6 and ids[0] == "passkey/300/0.2/0"
    for row in result["results"]:
        assert [r["sample_id"] for r in row["per_sample"]] == ids
        m = row["metrics"]
        assert m["num_samples"] == 6 and m["accuracy_ci95"][0] <= m["accuracy"] <= \
            m["accuracy_ci95"][1]
        assert 0.0 <= m["negative_rate"] <= 1.0 and len(m["negative_rate_ci95"]) == 2
    assert result["results"][0]["metrics"]["negative_rate"] == 0.0    # fp32 is the baseline
    for r in base:
        assert set(r) >= {"sample_id", "correct", "context_tokens", "depth"}
        assert isinstance(r["correct"], bool)
    # the deepest needle of a document runs first; the others reuse its text up to theirs
    # (every prompt shares the instruction with the ones before)
    intro = len("A special magic number is hidden in the following text. Memorize it.\n\n")
    by_doc = {}
    for r in base:
        by_doc.setdefault(r["sample_id"].rsplit("/", 1)[1], []).append(r)
    for rows in by_doc.values():
        cached = {r["depth"]: r["num_cached_prompt_tokens"] for r in rows}
        assert cached[0.8] <= intro < min(cached[0.2], cached[0.5])


def test_prefix_sharing_does_not_change_the_answers():
    """The same grid with the prefix cache off gives the same outputs."""
    def outputs(prefix_caching: bool):
        from tests.conftest import make_tiny_llm
        llm = make_tiny_llm(enable_prefix_caching=prefix_caching)
        llm.tokenizer = llm.engine.tokenizer = ByteTokenizer()
        task = get_task("needle", EvalOptions(context_tokens=(420,), depths=(0.3, 0.9),
                                              num_samples=2))
        run = task.run(llm, task.prepare(llm.tokenizer))
        return [(r["sample_id"], r["output"]) for r in run.per_sample], run.metrics
    with_cache, metrics = outputs(True)
    without, _ = outputs(False)
    assert with_cache == without
    assert metrics["num_cached_prompt_tokens"] > 0


def test_ppl_records_and_a_paired_relative_interval():
    result = run_tiny("ppl", ["fp32", "int4"], context_tokens=(32,), continuation_tokens=4,
                      num_samples=3)
    same, int4 = (r["metrics"] for r in result["results"])
    assert same["ppl_delta_rel"] == 0.0 and same["ppl_delta_rel_ci95"] == [0.0, 0.0]
    lo, hi = int4["ppl_delta_rel_ci95"]
    assert lo <= int4["ppl_delta_rel"] <= hi
    assert int4["ppl_delta_rel"] == pytest.approx(int4["ppl_delta_pct"] / 100)
    records = result["results"][1]["per_sample"]
    assert [r["sample_id"] for r in records] == ["ppl/32+4/0", "ppl/32+4/1", "ppl/32+4/2"]
    assert all(set(r) == {"sample_id", "nll_mean", "num_tokens"} for r in records)


class ChatByteTokenizer(ByteTokenizer):
    def apply_chat_template(self, messages, add_generation_prompt=True):
        return "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages) + \
            ("<assistant>" if add_generation_prompt else "")


def test_chat_generation_records_on_the_tiny_model():
    def make(spec):
        llm = tiny_factory()(spec)
        llm.tokenizer = llm.engine.tokenizer = ChatByteTokenizer()
        llm.engine.eos_token_ids = {ord("e")}       # a byte the random model emits at times
        return llm
    result = evaluate("chat_generation", ["fp32", "int2"],
                      EvalOptions(context_tokens=(40,), continuation_tokens=12, num_samples=4),
                      engine=EngineArgs(dtype="fp32"), make_llm=make)
    same = result["results"][0]["metrics"]
    assert same["output_tokens_mean_ratio"] == 1.0 and same["e2e_s_mean_ratio"] > 0
    for row in [result["baseline"], *result["results"]]:
        for r in row["per_sample"]:
            assert r["finish_reason"] in ("stop", "length") and r["e2e_s"] > 0
            assert 1 <= r["num_output_tokens"] <= 12
            if r["finish_reason"] == "length":
                assert r["num_output_tokens"] == 12
    assert "delta_num_output_tokens" in result["results"][1]["metrics"]


def test_chat_generation_needs_a_chat_template():
    def make(spec):                 # bytes as tokens, and no way to apply a chat template
        llm = tiny_factory()(spec)
        tok = ByteTokenizer()
        llm.tokenizer = llm.engine.tokenizer = SimpleNamespace(
            encode=tok.encode, decode=tok.decode, eos_token_ids=())
        return llm
    with pytest.raises(ValueError, match="chat template"):
        evaluate("chat_generation", ["fp32"], EvalOptions(context_tokens=(20,), num_samples=1),
                 engine=EngineArgs(dtype="fp32"), make_llm=make)
