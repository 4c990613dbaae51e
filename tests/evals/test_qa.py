"""``qa``: SQuAD normalisation and scores by hand, the JSONL errors naming the line, and
the task end to end on the tiny model."""
from __future__ import annotations

import json

import pytest

from kvmap.evals import EvalOptions, evaluate
from kvmap.evals.qa import exact_match, load_qa, normalize_answer, token_f1
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
    result = evaluate("qa", ["fp32", "int2"], EvalOptions(data_path=path), dtype="fp32",
                      make_llm=chat_factory)
    same, int2 = (r["metrics"] for r in result["results"])
    assert same["num_samples"] == 2 and same["negative_rate"] == 0.0
    assert same["delta_f1"]["mean"] == 0.0 and same["delta_exact_match"]["mean"] == 0.0
    assert 0.0 <= int2["f1"] <= 1.0 and "negative_rate_ci95" in int2
    records = result["results"][1]["per_sample"]
    assert [r["sample_id"] for r in records] == ["qa/0", "qa/1"]
    assert all(set(r) >= {"correct", "f1", "output", "answers"} for r in records)
    first = evaluate("qa", ["fp32"], EvalOptions(data_path=path, num_samples=1),
                     dtype="fp32", make_llm=chat_factory)
    assert first["results"][0]["metrics"]["num_samples"] == 1
    json.dumps(result)


def test_qa_bad_file_fails_before_any_model_loads(tmp_path):
    built: list[str] = []
    with pytest.raises(ValueError, match="needs a data file"):
        evaluate("qa", ["fp32"], EvalOptions(), dtype="fp32", make_llm=tiny_factory(built))
    path = write_jsonl(tmp_path / "qa.jsonl", [{"context": "c", "question": "q"}])
    with pytest.raises(ValueError, match="qa.jsonl:1: missing field 'answers'"):
        evaluate("qa", ["fp32"], EvalOptions(data_path=path), dtype="fp32",
                 make_llm=tiny_factory(built))
    assert built == []
