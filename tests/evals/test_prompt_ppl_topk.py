"""KL and top-1 over the returned top-k (``kvmap.evals.topk``): by hand, and through
``prompt_ppl`` on the tiny random-weight model, where the top-k it keeps in-process is the
one ``kvmap serve`` returns in OpenAI's shape."""
from __future__ import annotations

import math

import pytest
import torch

from kvmap.config import EngineArgs
from kvmap.evals import EvalOptions
from kvmap.evals.evaluation import evaluate
from kvmap.evals.topk import (KL_DEFINITION, position_kl, sample_topk, top_entries,
                              top_strings, topk_comparison)
from kvmap.model.byte_tokenizer import ByteTokenizer
from tests.evals.test_evals import tiny_factory


def test_kl_over_the_baselines_top_k_by_hand():
    p = {"a": math.log(0.6), "b": math.log(0.3)}           # renormalised: 2/3, 1/3
    q = {"b": math.log(0.4), "a": math.log(0.4), "c": math.log(0.1)}   # over {a, b}: 1/2, 1/2
    want = (2 / 3) * math.log((2 / 3) / 0.5) + (1 / 3) * math.log((1 / 3) / 0.5)
    assert position_kl(p, q) == pytest.approx(want)
    assert position_kl(p, p) == 0.0
    # "b" missing from the config's top-k takes the config's k-th logprob (0.1 here)
    q_missing = {"a": math.log(0.5), "c": math.log(0.1)}     # over {a, b}: 5/6, 1/6
    want = (2 / 3) * math.log((2 / 3) / (5 / 6)) + (1 / 3) * math.log((1 / 3) / (1 / 6))
    assert position_kl(p, q_missing) == pytest.approx(want)
    with pytest.raises(ValueError, match="non-empty"):
        position_kl(p, {})


def test_a_sample_is_the_mean_over_its_positions_and_top_1_compares_argmax_strings():
    base = [{"a": -0.1, "b": -2.0}, {"x": -0.5, "y": -1.0}]
    mine = [{"a": -0.1, "b": -2.0}, {"y": -0.2, "x": -1.9}]
    kl, top1 = sample_topk(base, mine)
    assert top1 == 0.5
    assert kl == pytest.approx(position_kl(base[1], mine[1]) / 2) and kl > 0
    with pytest.raises(ValueError, match="differ in number"):
        sample_topk(base, mine[:1])


def test_the_figure_is_the_mean_over_samples_with_a_bootstrap_interval():
    base = [{"sample_id": i, "top_logprobs": [{"a": -0.1, "b": -3.0}]} for i in range(4)]
    mine = [{"sample_id": i, "top_logprobs": [{"a": -0.1 - 0.1 * i, "b": -3.0 + 0.5 * i}]}
            for i in range(4)]
    out = topk_comparison(mine, base, seed=0)
    per_sample = [sample_topk(b["top_logprobs"], m["top_logprobs"])[0]
                  for b, m in zip(base, mine)]
    assert out["kl_topk"] == pytest.approx(sum(per_sample) / 4)
    lo, hi = out["kl_topk_ci95"]
    assert lo <= out["kl_topk"] <= hi and lo < hi
    assert out["top1_topk"] == 1.0 and out["top1_topk_ci95"] == [1.0, 1.0]
    assert out["num_samples"] == 4 and out["num_top_logprobs"] == 2
    assert out["kl_definition"] == KL_DEFINITION
    # samples without a top-k on either side are left out; none at all gives None
    assert topk_comparison(mine, [{"sample_id": 0, "top_logprobs": None}]) is None
    assert topk_comparison(mine[:1], base)["num_samples"] == 1


def test_top_strings_keep_the_most_likely_of_equal_strings_and_add_the_scored_token():
    decode = {1: "a", 2: "b", 3: "a", 4: "z"}
    out = top_strings([(1, -0.5), (3, -0.7), (2, -1.0)], lambda ids: decode[ids[0]], (4, -6.0))
    assert out == {"a": -0.5, "b": -1.0, "z": -6.0}
    assert top_entries(out, 2) == {"a": -0.5, "b": -1.0}
    assert list(top_entries({"x": -2.0, "y": -0.1234567}, 5)) == ["y", "x"]
    assert top_entries({"y": -0.1234567}, 5) == {"y": -0.123457}


def test_prompt_ppl_keeps_the_top_k_and_compares_it_with_the_baseline():
    result = evaluate("prompt_ppl", ["fp32", "int2"],
                      EvalOptions(context_tokens=(40,), num_samples=3, num_top_logprobs=3),
                      engine=EngineArgs(dtype="fp32"), make_llm=tiny_factory())
    same, int2 = (r["metrics"] for r in result["results"])
    assert same["kl_topk"] == 0.0 and same["top1_topk"] == 1.0
    assert int2["kl_topk"] > 0 and int2["kl_topk_ci95"][0] <= int2["kl_topk"]
    assert int2["top1_topk"] < 1.0          # int2 moves the random model's argmax at times
    for m in (same, int2):
        assert m["num_top_logprobs"] == 3 and m["kl_definition"] == KL_DEFINITION
    record = result["baseline"]["per_sample"][0]
    assert len(record["top_logprobs"]) == record["num_tokens"] == 39
    assert all(1 <= len(t) <= 3 for t in record["top_logprobs"])


def test_the_in_process_top_k_is_the_models_own():
    """The kept entries are the model's most likely next tokens at each position, their
    log-probabilities its log-softmax (as ``kvmap serve`` computes them)."""
    from kvmap.evals.prompt_ppl import engine_prompt_logprobs
    llm = tiny_factory()("fp32")
    ids = [5, 17, 200, 3, 99, 42, 7, 8]
    scores = engine_prompt_logprobs(llm.engine, ids, 4, ByteTokenizer().decode)
    ref = torch.log_softmax(llm.engine.score(list(ids)).float(), dim=-1)[:-1]
    decode = ByteTokenizer().decode
    for j, top in enumerate(scores.top):
        values, top_ids = ref[j].topk(4)
        first = decode([top_ids[0].item()])
        assert next(iter(top)) == first
        assert top[first] == pytest.approx(values[0].item(), abs=1e-5)
        assert scores.logprobs[j] == pytest.approx(ref[j, ids[j + 1]].item(), abs=1e-5)


def test_kvmap_serve_returns_the_top_k_in_openais_shape_built_the_same_way():
    """``kvmap serve``'s ``top_logprobs``: a list of ``{token: logprob}`` dicts (None at
    position 0), of equal strings the most likely, plus the scored token itself."""
    from kvmap.server.logprobs import ScoredTokens, openai_logprobs
    decode = {1: "a", 2: "b", 3: "a", 4: "z"}
    scored = ScoredTokens([2, 4], [None, -6.0], [None, [(1, -0.5), (3, -0.7), (2, -1.0)]])
    out = openai_logprobs(scored, 0, lambda ids: "".join(decode[i] for i in ids))
    assert out["top_logprobs"] == [None, {"a": -0.5, "b": -1.0, "z": -6.0}]
    assert out["tokens"] == ["b", "z"] and out["token_logprobs"] == [None, -6.0]


def test_samples_scored_over_other_positions_are_left_out_not_fatal():
    base = [{"sample_id": 0, "top_logprobs": [{"a": -0.1}, {"b": -0.2}]},
            {"sample_id": 1, "top_logprobs": [{"a": -0.1}]}]
    mine = [{"sample_id": 0, "top_logprobs": [{"a": -0.1}]},
            {"sample_id": 1, "top_logprobs": [{"a": -0.3}]}]
    out = topk_comparison(mine, base)
    assert out["num_samples"] == 1 and out["kl_topk"] == 0.0
