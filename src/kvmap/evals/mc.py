"""``mc``: multiple-choice scoring by log-likelihood, from a JSONL file in HellaSwag or
ARC format (detected per line).

    HellaSwag  {"ctx": str (or "ctx_a" + "ctx_b"), "endings": [str, ...], "label": int,
                "activity_label": str (optional)}
    ARC        {"question": {"stem": str, "choices": [{"text", "label"}, ...]},
                "answerKey": "A"}                                  (AI2's own files)
               {"question": str, "choices": {"text": [...], "label": [...]},
                "answerKey": "A"}                                  (Hugging Face datasets)

Prompts follow lm-evaluation-harness: HellaSwag's context is ``"<activity_label>:
<ctx>"`` and each choice is ``" " + ending``; ARC's context is ``"Question: <stem>\\nAnswer:"``
and each choice ``" " + text``. Context and choice are tokenized separately and joined.
Each choice is scored by ``Engine.score(context + choice, num_context_tokens=len(context))``:
the context is prefilled (a selection policy compresses it), the choice tokens are fed
one decode step at a time through the cache, and their log-probabilities summed.
``accuracy`` picks the highest sum; ``accuracy_norm`` divides each sum by the choice's
length in characters first (lm-eval's ``acc_norm``). The paired value is ``accuracy``'s
per-question correctness. ``--samples N`` takes the first N questions.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass

import numpy as np

from kvmap.evals.base import TASKS, Column, Task, TaskRun, load_jsonl_items
from kvmap.evals.kv_peak import track_peak_kv_bytes
from kvmap.evals.ppl import log_probs, token_nll
from kvmap.evals.stats import accuracy_metrics, paired_delta, paired_values
from kvmap.workloads.corpus import encode_text


@dataclass(frozen=True)
class MCItem:
    context: str
    choices: tuple[str, ...]     # continuations, each with its leading space
    label: int                   # index of the right choice


def _clean_hellaswag(text: str) -> str:
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def parse_item(record: object, where: str) -> MCItem:
    """One JSONL record -> ``MCItem``; ValueError naming ``where`` (file:line) if neither
    format fits."""
    if isinstance(record, dict) and "endings" in record:
        ctx = record.get("ctx") or f"{record.get('ctx_a', '')} " \
                                   f"{str(record.get('ctx_b', '')).capitalize()}"
        if record.get("activity_label"):
            ctx = f"{record['activity_label']}: {ctx}"
        endings, label = record["endings"], record.get("label")
        try:
            label = int(label)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: HellaSwag 'label' {label!r} is not an integer") from None
        if not isinstance(endings, list) or not 0 <= label < len(endings):
            raise ValueError(f"{where}: HellaSwag 'label' {label} is not an index into "
                             f"'endings'")
        return MCItem(_clean_hellaswag(ctx), tuple(" " + _clean_hellaswag(str(e))
                                                   for e in endings), label)
    if isinstance(record, dict) and "answerKey" in record:
        question = record.get("question")
        choices = record.get("choices")
        if isinstance(question, dict):                      # AI2 form
            stem = question.get("stem", "")
            texts = [c.get("text", "") for c in question.get("choices", [])]
            labels = [c.get("label") for c in question.get("choices", [])]
        elif isinstance(choices, dict):                     # Hugging Face form
            stem, texts, labels = question, choices.get("text", []), choices.get("label", [])
        else:
            raise ValueError(f"{where}: ARC record has neither question.choices nor choices")
        key = str(record["answerKey"])
        if key not in [str(x) for x in labels]:
            raise ValueError(f"{where}: ARC answerKey {key!r} is not one of the labels "
                             f"{labels}")
        return MCItem(f"Question: {stem}\nAnswer:", tuple(f" {t}" for t in texts),
                      [str(x) for x in labels].index(key))
    raise ValueError(f"{where}: not a HellaSwag record (no 'endings') nor an ARC record "
                     f"(no 'answerKey')")


def load_items(path) -> list:
    """All items of a JSONL file; ValueError naming the path or the bad line."""
    return load_jsonl_items(path, parse_item)


@TASKS.register
class MCTask(Task):
    """Multiple choice by summed log-likelihood (module docstring)."""

    name = "mc"
    kind = "accuracy"
    takes = frozenset({"data_path"})
    columns = (Column("accuracy", "accuracy", "{:.2%}"), Column("acc CI95", "accuracy_ci95", "ci"),
               Column("acc_norm", "accuracy_norm", "{:.2%}"), Column("n", "num_samples", "{}"),
               Column("Δacc CI", "delta_accuracy", "ci"),
               Column("neg. rate", "negative_rate", "{:.2%}"))

    def __init__(self, options):
        super().__init__(options)
        if options.data_path is None:
            raise ValueError("task 'mc' needs a data file (--data FILE.jsonl)")
        if options.context_tokens:
            raise ValueError(f"context={list(options.context_tokens)}: task 'mc' takes its "
                             f"contexts from the data file; drop --context")
        self.items = load_items(options.data_path)[:options.num_samples]

    def max_tokens_needed(self, samples: list | None = None) -> int:
        if samples is None:
            return 0
        return max(len(ctx) + len(choice) for ctx, choices, _ in samples for choice in choices)

    def prepare(self, tokenizer) -> list[tuple[list[int], list[list[int]], int]]:
        """``(context_ids, [choice_ids, ...], label)`` per question."""
        samples = []
        for item in self.items:
            ctx = encode_text(tokenizer, item.context)
            choices = [encode_text(tokenizer, c) for c in item.choices]
            if not ctx or not all(choices):
                raise ValueError(f"question {item.context[:60]!r} has an empty context or "
                                 f"choice after tokenization")
            samples.append((ctx, choices, item.label))
        return samples

    def run(self, llm, samples) -> TaskRun:
        t0 = time.perf_counter()
        correct, correct_norm = [], []
        with track_peak_kv_bytes(llm.engine) as peak:
            for ctx, choices, label in samples:
                sums = [-float(token_nll(log_probs(llm.engine.score(
                    ctx + choice, num_context_tokens=len(ctx))), choice).sum())
                    for choice in choices]
                chars = [len(llm.tokenizer.decode(choice)) for choice in choices]
                correct.append(int(np.argmax(sums)) == label)
                norm = [s / max(1, n) for s, n in zip(sums, chars)]
                correct_norm.append(int(np.argmax(norm)) == label)
        metrics = {**accuracy_metrics(correct),
                   "accuracy_norm": float(np.mean(correct_norm)),
                   "kv_bytes_peak": peak[0], "wall_s": time.perf_counter() - t0}
        records = [{"sample_id": f"mc/{i}", "correct": ok, "correct_norm": ok_norm}
                   for i, (ok, ok_norm) in enumerate(zip(correct, correct_norm))]
        return TaskRun(metrics, records)

    def compare(self, run: TaskRun, baseline: TaskRun) -> dict:
        mine, theirs = paired_values(run.per_sample, baseline.per_sample, "correct_norm")
        return {**super().compare(run, baseline),
                "delta_accuracy_norm": paired_delta(mine, theirs, seed=self.options.seed)}
