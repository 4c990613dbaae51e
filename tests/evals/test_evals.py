"""Accuracy tasks on the tiny random model (fp32) with a byte-level tokenizer: the math by
hand, each task end to end, the errors, and the ``kvmap eval`` command."""
from __future__ import annotations

import json
import math

import pytest
import torch
import typer
from typer.testing import CliRunner

from kvmap.config import EngineArgs
from kvmap.evals import EvalOptions, evaluate
from kvmap.evals.generation import first_divergence
from kvmap.evals.mc import load_items, parse_item
from kvmap.evals.retrieval import (first_number_is as is_correct, grid_summary,
                                   insert_sentences, needle_prompt)
from kvmap.evals.stats import wilson_interval
from kvmap.evals.ppl import (kl_divergence, log_probs, perplexity, tied_top1, token_nll,
                             top1_agreement, top1_agreement_with_ties)
from kvmap.evals.stats import bootstrap_mean_ci, paired_delta, paired_deltas, ratio_pct
from kvmap.model.byte_tokenizer import ByteTokenizer   # fits the tiny 256-token vocabulary
from tests.conftest import make_tiny_llm


def tiny_factory(built: list[str] | None = None):
    def make(spec: str):
        if built is not None:
            built.append(spec)
        llm = make_tiny_llm(kv=spec)
        llm.tokenizer = llm.engine.tokenizer = ByteTokenizer()
        return llm
    return make


def run_tiny(task: str, specs, **options) -> dict:
    return evaluate(task, specs, EvalOptions(**options), engine=EngineArgs(dtype="fp32"),
                    make_llm=tiny_factory())


# ---- math by hand ----------------------------------------------------------------------
def test_nll_and_perplexity_of_uniform_logits_is_vocab_size():
    logp = log_probs(torch.zeros(3, 4))                     # uniform over 4 tokens
    nll = token_nll(logp, [0, 1, 3])
    assert torch.allclose(nll, torch.full((3,), math.log(4)))
    assert perplexity(nll) == pytest.approx(4.0)
    assert perplexity([0.0, 2 * math.log(2)]) == pytest.approx(2.0)   # exp(mean)


def test_kl_divergence_by_hand():
    p = torch.tensor([[0.5, 0.5], [0.9, 0.1]]).log()
    q = torch.tensor([[0.25, 0.75], [0.9, 0.1]]).log()
    kl = kl_divergence(p, q)
    expected = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert kl[0].item() == pytest.approx(expected, rel=1e-5)
    assert kl[1].item() == pytest.approx(0.0, abs=1e-7)
    # p has a zero where q does not: that term is 0, not nan
    zero = torch.tensor([[1.0, 0.0]]).log()
    assert kl_divergence(zero, torch.tensor([[0.5, 0.5]]).log()).item() == \
        pytest.approx(math.log(2), rel=1e-5)
    with pytest.raises(ValueError, match="shapes differ"):
        kl_divergence(p, q[:1])


def test_top1_agreement_and_nll_target_count():
    ref = torch.tensor([[3.0, 1.0, 0.0], [0.0, 2.0, 1.0]])
    other = torch.tensor([[2.0, 1.0, 0.0], [0.0, 1.0, 2.0]])
    assert top1_agreement(ref, other).tolist() == [True, False]
    with pytest.raises(ValueError, match="2 targets for 3 positions"):
        token_nll(log_probs(torch.zeros(3, 4)), [0, 1])


def test_bootstrap_intervals():
    assert bootstrap_mean_ci([2.0, 2.0, 2.0]) == (2.0, 2.0)
    assert bootstrap_mean_ci([5.0]) == (5.0, 5.0)
    values = [0.0, 1.0] * 20
    low, high = bootstrap_mean_ci(values, seed=3)
    assert low < 0.5 < high and (low, high) == bootstrap_mean_ci(values, seed=3)
    assert 0.3 < low and high < 0.7              # ~0.5 +- 2 * 0.5 / sqrt(40)
    with pytest.raises(ValueError, match="at least one"):
        bootstrap_mean_ci([])
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_mean_ci([1.0], confidence=1.5)


def test_paired_delta_and_ratio():
    assert paired_deltas([3.0, 5.0], [1.0, 1.0]) == [2.0, 4.0]
    d = paired_delta([3.0, 5.0], [1.0, 1.0])
    assert d["mean"] == 3.0 and d["n"] == 2 and 2.0 <= d["ci_low"] <= d["ci_high"] <= 4.0
    with pytest.raises(ValueError, match="2 values vs 1 baseline"):
        paired_deltas([1.0, 2.0], [1.0])
    pct = ratio_pct({"mean": math.log(1.1), "ci_low": 0.0, "ci_high": math.log(1.2), "n": 1})
    assert pct["mean"] == pytest.approx(10.0) and pct["ci_low"] == 0.0
    assert pct["ci_high"] == pytest.approx(20.0)


# ---- retrieval and generation helpers -------------------------------------------------
def test_insert_sentences_at_depths():
    doc = "One. Two. Three. Four."
    assert insert_sentences(doc, [(0.0, "X.")]) == "X. One. Two. Three. Four."
    assert insert_sentences(doc, [(1.0, "X.")]) == "One. Two. Three. Four. X."
    assert insert_sentences(doc, [(0.5, "X."), (1.0, "Y.")]) == \
        "One. Two. X. Three. Four. Y."
    prompt = needle_prompt(doc, [(0.5, "Osaka", "12345"), (0.0, "Quito", "67890")])
    assert "The special magic number for Osaka is 12345." in prompt
    assert "The special magic number for Quito is 67890." in prompt
    assert prompt.endswith("The special magic number for Osaka is")
    assert prompt.startswith("Some special magic numbers")


def test_needle_scoring_and_grid():
    assert is_correct(" 12345.", "12345")
    assert not is_correct(" 67890, not 12345", "12345")     # first number counts
    assert not is_correct(" unknown", "12345")
    grid = grid_summary([(1024, 0.1), (1024, 0.1), (2048, 0.5)], [True, False, True])
    assert grid == [{"context_tokens": 1024, "depth": 0.1, "accuracy": 0.5,
                     "accuracy_ci95": wilson_interval(1, 2), "n": 2},
                    {"context_tokens": 2048, "depth": 0.5, "accuracy": 1.0,
                     "accuracy_ci95": wilson_interval(1, 1), "n": 1}]


def test_first_divergence():
    assert first_divergence([1, 2, 3, 4], [1, 2, 9, 4]) == 2
    assert first_divergence([1, 2, 3], [1, 2, 3]) == 3
    assert first_divergence([5], [6]) == 0


# ---- multiple-choice data ---------------------------------------------------------------
HELLASWAG = {"activity_label": "Baking", "ctx": "She puts the tray in the oven. She",
             "endings": ["waits.", "eats.", "flies.", "sings [title] on."],
             "label": 0}
ARC_AI2 = {"question": {"stem": "What is 2 + 2?",
                        "choices": [{"text": "3", "label": "A"}, {"text": "4", "label": "B"}]},
           "answerKey": "B"}
ARC_HF = {"question": "Which is a planet?",
          "choices": {"text": ["Mars", "Moon", "Sun"], "label": ["1", "2", "3"]},
          "answerKey": "1"}


def test_parse_hellaswag_and_arc():
    item = parse_item(HELLASWAG, "f:1")
    assert item.context == "Baking: She puts the tray in the oven. She"
    assert item.choices[0] == " waits." and item.choices[3] == " sings. on." and \
        item.label == 0
    arc = parse_item(ARC_AI2, "f:2")
    assert arc.context == "Question: What is 2 + 2?\nAnswer:"
    assert arc.choices == (" 3", " 4") and arc.label == 1
    assert parse_item(ARC_HF, "f:3").label == 0
    with pytest.raises(ValueError, match="f:4: ARC answerKey 'C'"):
        parse_item({**ARC_AI2, "answerKey": "C"}, "f:4")
    with pytest.raises(ValueError, match="f:5: not a HellaSwag record"):
        parse_item({"text": "x"}, "f:5")


def write_jsonl(path, records) -> str:
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return str(path)


def test_load_items_errors(tmp_path):
    with pytest.raises(ValueError, match="nope.jsonl' does not exist"):
        load_items(tmp_path / "nope.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(HELLASWAG) + "\n{oops\n")
    with pytest.raises(ValueError, match="bad.jsonl:2: not valid JSON"):
        load_items(bad)


# ---- tasks end to end on the tiny model -------------------------------------------------
def test_ppl_task_identity_quantization_and_policy():
    result = run_tiny("ppl", ["fp32", "int8", "int2", "window(size=16)"],
                      context_tokens=(40,), continuation_tokens=6, num_samples=2)
    assert result["baseline"]["kv"] == "fp32"
    by_spec = {r["kv"]: r["metrics"] for r in result["results"]}
    same = by_spec["fp32"]
    assert same["kl_mean"] == 0.0 and same["top1_agreement"] == 1.0
    assert same["ppl"] == same["ppl_baseline"] and same["delta_nll"]["mean"] == 0.0
    assert same["num_tokens_scored"] == 12
    int8, int2 = by_spec["int8"], by_spec["int2"]
    assert 0 < int8["kl_mean"] < int2["kl_mean"]
    assert int8["kl_p99"] >= int8["kl_mean"] and int8["top1_agreement"] >= 0.75
    assert int8["ppl_delta_pct"] == pytest.approx(
        100 * (int8["ppl"] / int8["ppl_baseline"] - 1))
    assert int2["kv_bytes_peak"] < int8["kv_bytes_peak"] < same["kv_bytes_peak"]
    assert same["kv_bytes_peak"] == 12 * 2048      # 46 tokens: 12 blocks of 4 fp32 tokens
    assert by_spec["window(size=16)"]["kv_bytes_peak"] < same["kv_bytes_peak"]
    json.dumps(result)                                  # JSON-able throughout


def test_generation_task():
    result = run_tiny("generation", ["fp32", "int2"], context_tokens=(32,),
                      continuation_tokens=6, num_samples=3)
    same, int2 = (r["metrics"] for r in result["results"])
    assert same["exact_match"] == 1.0 and same["first_divergence"] == [6, 6, 6]
    assert same["token_agreement"] == 1.0 and same["delta_exact_match"]["mean"] == 0.0
    assert 0.0 <= int2["exact_match"] <= 1.0 and len(int2["first_divergence"]) == 3


def test_needle_task_grid():
    result = run_tiny("needle", ["fp32", "int8"], context_tokens=(280,), depths=(0.2, 0.8),
                      num_samples=1, num_needles=2)
    for row in result["results"]:
        m = row["metrics"]
        assert m["n"] == 2 and 0.0 <= m["accuracy"] <= 1.0
        assert [(c["context_tokens"], c["depth"]) for c in m["grid"]] == [(280, 0.2),
                                                                          (280, 0.8)]
    assert result["results"][0]["metrics"]["delta_accuracy"]["mean"] == 0.0


def test_mc_task_on_hellaswag_and_arc(tmp_path):
    data = write_jsonl(tmp_path / "mc.jsonl", [HELLASWAG, ARC_AI2, ARC_HF])
    result = run_tiny("mc", ["fp32", "int8"], data_path=data)
    same, int8 = (r["metrics"] for r in result["results"])
    assert same["n"] == 3 and same["delta_accuracy"]["mean"] == 0.0
    assert same["accuracy"] in (0.0, 1 / 3, 2 / 3, 1.0) and "accuracy_norm" in int8
    first = evaluate("mc", ["fp32"], EvalOptions(data_path=data, num_samples=1),
                     engine=EngineArgs(dtype="fp32"), make_llm=tiny_factory())
    assert first["results"][0]["metrics"]["n"] == 1


@pytest.mark.parametrize("task, specs, options, message", [
    ("bleu", ["fp32"], {}, "task 'bleu' is not one of"),
    ("ppl", ["int9"], {}, "unknown KV spec part 'int9'"),
    ("ppl", ["int8(granularity=atom)"], {}, "atom"),
    ("mc", ["fp32"], {"data_path": "/no/such.jsonl"}, "/no/such.jsonl"),
    ("mc", ["fp32"], {}, "needs a data file"),
    ("ppl", ["fp32"], {"context_tokens": (64, 128)}, "takes one context length"),
    ("ppl", [], {}, "no KV spec"),
])
def test_bad_input_fails_before_any_model_loads(task, specs, options, message):
    built: list[str] = []
    with pytest.raises(ValueError, match=message):
        evaluate(task, specs, EvalOptions(**options), engine=EngineArgs(dtype="fp32"),
                 make_llm=tiny_factory(built))
    assert built == []


def test_context_longer_than_the_model_fails_before_any_sample():
    built: list[str] = []
    with pytest.raises(ValueError, match=r"context=\[600\].*model's context is 512"):
        evaluate("ppl", ["int8"], EvalOptions(context_tokens=(600,)),
                 engine=EngineArgs(dtype="fp32"),
                 make_llm=tiny_factory(built))
    assert built == ["fp32"]                 # the baseline loaded; nothing ran
    with pytest.raises(ValueError, match="must be a positive"):
        EvalOptions(context_tokens=(0,))


def test_passkey_task_when_available():
    pytest.importorskip("kvmap.evals.passkey")
    result = run_tiny("passkey", ["fp32"], context_tokens=(300,), depths=(0.5,),
                      num_samples=1)
    metrics = result["results"][0]["metrics"]
    assert metrics["n"] == 1 and metrics["delta_accuracy"]["mean"] == 0.0
    assert metrics["grid"][0]["context_tokens"] == 300


# ---- the command -------------------------------------------------------------------------
@pytest.fixture
def invoke():
    from kvmap.evals.command import register
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        """Test app."""

    register(app, make_llm=tiny_factory())
    return lambda *args: CliRunner().invoke(app, ["eval", *args])


def test_cli_json(invoke):
    out = invoke("--task", "ppl", "--kv", "fp32", "--kv", "int8", "--dtype", "fp32",
                 "--context", "40", "--continuation", "4", "--samples", "1", "--json")
    assert out.exit_code == 0, out.output
    result = json.loads(out.stdout)
    assert result["task"] == "ppl" and [r["kv"] for r in result["results"]] == ["fp32", "int8"]
    for key in ("ppl", "ppl_baseline", "kl_mean", "kl_p99", "top1_agreement", "kv_bytes_peak"):
        assert key in result["results"][1]["metrics"]


def test_cli_table(invoke):
    out = invoke("--task", "generation", "--kv", "int8", "--dtype", "fp32", "--context", "16",
                 "--continuation", "3", "--samples", "1")
    assert out.exit_code == 0, out.output
    assert "exact match" in out.stdout and "int8" in out.stdout


@pytest.mark.parametrize("args, message", [
    (["--task", "bleu", "--kv", "int8"], "task 'bleu'"),
    (["--task", "ppl", "--kv", "int9"], "'int9'"),
    (["--task", "mc", "--kv", "int8", "--data", "/no/such.jsonl"], "/no/such.jsonl"),
    (["--task", "ppl", "--kv", "int8", "--text-file", "/no/corpus.txt"], "/no/corpus.txt"),
    (["--task", "ppl", "--kv", "int8", "--data", "x.jsonl"], "--data does not apply"),
    (["--task", "ppl", "--kv", "int8", "--dtype", "fp32", "--context", "4000"],
     "context=[4000]"),
])
def test_cli_errors_exit_2_naming_the_value(invoke, args, message):
    out = invoke(*args)
    assert out.exit_code == 2
    assert "error:" in out.output and message in out.output


def test_top1_agreement_counts_a_tie_of_the_baseline():
    """A baseline with two exactly tied maxima: the other run picking either one agrees
    under the tie-aware count, and only the first under plain argmax."""
    ref = log_probs(torch.tensor([[2.0, 2.0, 0.0], [3.0, 1.0, 0.0]]))
    other = log_probs(torch.tensor([[1.0, 2.5, 0.0], [1.0, 3.0, 0.0]]))
    assert top1_agreement(ref, other).tolist() == [False, False]
    assert top1_agreement_with_ties(ref, other).tolist() == [True, False]
    assert tied_top1(ref).tolist() == [True, False]
