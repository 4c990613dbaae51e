"""The built-in QA set measures something only if the full-cache bf16 baseline answers
it: on the real embedded model, unfiltered (docs/qa.md: 43/48 on the default set, 14/16
on the short form of examples/block-sizes.yaml)."""
from __future__ import annotations

import pytest

from kvmap.evals import EvalOptions, get_task

pytestmark = pytest.mark.slow


def test_full_cache_answers_the_builtin_qa_set(real_llm):
    task = get_task("qa", EvalOptions(num_samples=16, context_tokens=(384, 768)))
    run = task.run(real_llm, task.prepare(real_llm.tokenizer))
    wrong = [(r["answers"], r["output"]) for r in run.per_sample if not r["correct"]]
    assert run.metrics["num_samples"] == 16
    assert run.metrics["exact_match"] >= 0.75, wrong
    assert run.metrics["f1"] >= run.metrics["exact_match"]
