"""``qa``: SQuAD normalisation and scores by hand, the JSONL errors naming the line, and
the task end to end on the tiny model."""
from __future__ import annotations

import json

import pytest

from kvmap.config import EngineArgs
from kvmap.evals import EvalOptions, evaluate
from kvmap.evals.qa import QATask, exact_match, load_qa, normalize_answer, token_f1
from kvmap.evals.qa_builtin import (DEFAULT_CONTEXT_TOKENS, DEFAULT_NUM_QUESTIONS,
                                    FACTS_PER_CONTEXT, RELATIONS, builtin_records)
from tests.evals.test_evals import tiny_factory, write_jsonl
from tests.evals.test_records_and_rates import ChatByteTokenizer


def test_squad_normalisation_and_scores_by_hand():
    assert normalize_answer("  The Eiffel-Tower, in PARIS! ") == "eiffeltower in paris"
    assert normalize_answer("an apple a day") == "apple day"
    assert exact_match("the Paris.", ("Paris",)) and not exact_match("Paris, France", ("Paris",))
    assert exact_match("Lyon", ("Paris", "lyon"))                   # any reference
    # prediction "paris france" vs "paris": precision 1/2, recall 1 -> F1 2/3
    assert token_f1("Paris, France", ("Paris",)) == pytest.approx(2 / 3)
    assert token_f1("Paris, France", ("Lyon", "in France")) == pytest.approx(0.5)  # 1/2, 1/2
    assert token_f1("Berlin", ("Paris",)) == 0.0 and token_f1("the", ("a",)) == 1.0


@pytest.mark.parametrize("line, message", [
    ({"question": "q?", "answers": ["a"]}, "qa.jsonl:2: missing field 'context'"),
    ({"context": "c", "question": "q?", "answers": []}, "qa.jsonl:2: 'answers' is empty"),
    ({"context": "c", "question": "q?", "answers": ["", " the "]}, "qa.jsonl:2: 'answers' is"),
    ({"context": "c", "question": "q?", "answers": [3]}, "qa.jsonl:2: 'answers' must be a list"),
    ({"context": " ", "question": "q?", "answers": ["yes"]}, "qa.jsonl:2: 'context' must be"),
])
def test_bad_qa_lines_name_the_line(tmp_path, line, message):
    good = {"context": "Paris is in France.", "question": "Where is Paris?",
            "answers": ["France"]}
    path = write_jsonl(tmp_path / "qa.jsonl", [good, line])
    with pytest.raises(ValueError, match=message):
        load_qa(path)


def test_squad_hf_answers_and_the_file_errors(tmp_path):
    path = write_jsonl(tmp_path / "qa.jsonl", [
        {"context": "c", "question": "q?", "answers": {"text": ["x", "y"], "answer_start": [0, 1]}}])
    assert load_qa(path)[0].answers == ("x", "y")
    with pytest.raises(ValueError, match="does not exist"):
        load_qa(tmp_path / "none.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="has no questions"):
        load_qa(tmp_path / "empty.jsonl")


def chat_factory(spec):
    llm = tiny_factory()(spec)
    llm.tokenizer = llm.engine.tokenizer = ChatByteTokenizer()
    return llm


def test_qa_task_end_to_end_on_a_file_and_built_in(tmp_path):
    path = write_jsonl(tmp_path / "qa.jsonl", [
        {"context": "Paris is in France.", "question": "Where is Paris?", "answers": ["France"]},
        {"context": "Rome is in Italy.", "question": "Where is Rome?", "answers": ["Italy"]}])
    result = evaluate("qa", ["fp32", "int2"], EvalOptions(data_path=path),
                      engine=EngineArgs(dtype="fp32"),
                      make_llm=chat_factory)
    same, int2 = (r["metrics"] for r in result["results"])
    assert same["num_samples"] == 2 and same["negative_rate"] == 0.0
    assert same["delta_f1"]["mean"] == 0.0 and same["delta_exact_match"]["mean"] == 0.0
    assert 0.0 <= int2["f1"] <= 1.0 and "negative_rate_ci95" in int2
    records = result["results"][1]["per_sample"]
    assert [r["sample_id"] for r in records] == ["qa/0", "qa/1"]
    assert all(set(r) >= {"correct", "f1", "output", "answers"} for r in records)
    first = evaluate("qa", ["fp32"], EvalOptions(data_path=path, num_samples=1),
                     engine=EngineArgs(dtype="fp32"), make_llm=chat_factory)
    assert first["results"][0]["metrics"]["num_samples"] == 1
    json.dumps(result)


def test_qa_bad_file_fails_before_any_model_loads(tmp_path):
    built: list[str] = []
    path = write_jsonl(tmp_path / "qa.jsonl", [{"context": "c", "question": "q"}])
    with pytest.raises(ValueError, match="qa.jsonl:1: missing field 'answers'"):
        evaluate("qa", ["fp32"], EvalOptions(data_path=path),
                 engine=EngineArgs(dtype="fp32"), make_llm=tiny_factory(built))
    good = write_jsonl(tmp_path / "good.jsonl", [{"context": "c", "question": "q?",
                                                   "answers": ["a"]}])
    with pytest.raises(ValueError, match="--context: task 'qa' takes its contexts from"):
        evaluate("qa", ["fp32"], EvalOptions(data_path=good, context_tokens=(300,)),
                 engine=EngineArgs(dtype="fp32"), make_llm=tiny_factory(built))
    bad_prefix = write_jsonl(tmp_path / "p.jsonl", [{"context": "c", "question": "q?",
                                                      "answers": ["yes"], "answer_prefix": 3}])
    with pytest.raises(ValueError, match="p.jsonl:1: 'answer_prefix' must be a string"):
        load_qa(bad_prefix)
    assert built == []


def test_builtin_records_are_spans_of_their_context_by_code():
    tok = ChatByteTokenizer()
    records = builtin_records(tok, context_tokens=(200, 400), num_questions=10, seed=3)
    assert records == builtin_records(tok, context_tokens=(200, 400), num_questions=10,
                                      seed=3)                          # pure in its inputs
    assert records != builtin_records(tok, context_tokens=(200, 400), num_questions=10,
                                      seed=4)
    assert [r["context_tokens"] for r in records] == [200, 400] * 5
    by_name = {r.name: r for r in RELATIONS}
    for r in records:
        (answer,) = r["answers"]
        relation = by_name[r["relation"]]
        key = r["answer_prefix"][len(relation.answer_prefix.split("{k}")[0]):
                                 len(r["answer_prefix"]) - len(relation.answer_prefix
                                                                .split("{k}")[1])]
        # the asked fact is stated once, word for word, in the context; the answer is its span
        fact = relation.fact.format(k=key, v=answer)
        assert r["context"].count(fact) == 1 and answer in r["context"]
        assert r["question"] == relation.question.format(k=key)
        assert r["answer_prefix"] == relation.answer_prefix.format(k=key)
        # FACTS_PER_CONTEXT facts of distinct relations: the others are distractors
        stated = [x for x in RELATIONS if x.fact.split("{k}")[0] in r["context"]]
        assert len(stated) >= FACTS_PER_CONTEXT
        assert 0.5 * r["context_tokens"] < len(tok.encode(r["context"])) \
            < 1.2 * r["context_tokens"]
    assert len({r["relation"] for r in records}) > 2
    with pytest.raises(ValueError, match="context=40 tokens leaves no room"):
        builtin_records(tok, context_tokens=(40,), num_questions=1)


def test_qa_without_a_file_runs_the_builtin_set_on_the_tiny_model():
    result = evaluate("qa", ["fp32"], EvalOptions(context_tokens=(220,), num_samples=3),
                      engine=EngineArgs(dtype="fp32"), make_llm=chat_factory)
    records = result["results"][0]["per_sample"]
    assert [r["sample_id"] for r in records] == ["qa/0", "qa/1", "qa/2"]
    assert all(r["context_tokens"] == 220 and r["num_prompt_tokens"] > 220 for r in records)
    assert result["results"][0]["metrics"]["num_samples"] == 3
    defaults = QATask(EvalOptions())
    samples = defaults.prepare(ChatByteTokenizer())
    assert len(samples) == DEFAULT_NUM_QUESTIONS
    assert {item.context_tokens for item, _ in samples} == set(DEFAULT_CONTEXT_TOKENS)
    assert all(item.answer_prefix for item, _ in samples)


def test_builtin_context_is_checked_against_the_model_before_it_runs():
    assert QATask(EvalOptions(context_tokens=(300, 900))).max_tokens_needed() == 900 + 64 + 16
    built: list[str] = []
    with pytest.raises(ValueError, match=r"context=\[600\]: task 'qa' needs sequences of"):
        evaluate("qa", ["fp32"], EvalOptions(context_tokens=(600,)),
                 engine=EngineArgs(dtype="fp32"),
                 make_llm=tiny_factory(built))
    assert built == ["fp32"]           # the check needs the model's config: right after it
