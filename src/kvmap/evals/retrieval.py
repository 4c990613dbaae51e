"""What ``passkey`` and ``needle`` share: the RULER-style needle wording, placing sentences
at depths of a document, scoring, and running a context x depth grid cheaply.

    A special magic number is hidden in the following text. Memorize it.

    <document ... The special magic number for <city> is <5 digits>. ... document>

    What is the special magic number for <city>? The special magic number for <city> is

(the wording SmolLM2-135M answers with a full cache; CALIBRATION.md).

Cheap trials. The prompts of one *group* -- one document (one context length, one sample
index) at every depth -- are identical up to their needle, so they run deepest needle
first and alone, then the group's other depths together in one continuous batch: each
of those finds the document up to its own needle in the prefix cache and prefills only
its tail (about ``(1 - depth)`` of the prompt), and their answers decode in one batch.
Answers stop at the period after the key (``ANSWER_TOKENS``: a space, five digits, a
period are seven tokens for SmolLM2's digit-splitting BPE).
"""
from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import ClassVar

from kvmap.evals.base import Column, Task, TaskRun
from kvmap.evals.kv_peak import track_peak_kv_bytes
from kvmap.evals.stats import accuracy_metrics, wilson_interval
from kvmap.request import SamplingParams

ANSWER_TOKENS = 7
_SENTENCE_GAP = re.compile(r"(?<=[.!?])\s+")
_NUMBER = re.compile(r"\d+")


def needle_sentence(city: str, number: str) -> str:
    return f"The special magic number for {city} is {number}."


def insert_sentences(document: str, sentences: list[tuple[float, str]]) -> str:
    """``document`` with each ``(depth, sentence)`` at the sentence boundary nearest
    ``depth * len(document)``; sentences at the same boundary keep their given order."""
    cuts = [0, *(m.start() for m in _SENTENCE_GAP.finditer(document)), len(document)]
    placed = sorted(((min(cuts, key=lambda c: abs(c - d * len(document))), i, s)
                     for i, (d, s) in enumerate(sentences)))
    pieces, start = [], 0
    for cut, _, sentence in placed:
        pieces += [document[start:cut].strip(), sentence]
        start = cut
    pieces.append(document[start:].strip())
    return " ".join(p for p in pieces if p)


def needle_prompt(document: str, needles: list[tuple[float, str, str]]) -> str:
    """The full prompt; ``needles`` are ``(depth, city, number)``, the first is asked."""
    intro = ("A special magic number is hidden in the following text. Memorize it."
             if len(needles) == 1 else
             "Some special magic numbers are hidden in the following text. Memorize them.")
    body = insert_sentences(document, [(d, needle_sentence(c, n)) for d, c, n in needles])
    city = needles[0][1]
    return (f"{intro}\n\n{body}\n\nWhat is the special magic number for {city}? "
            f"The special magic number for {city} is")


def first_number_is(output_text: str, expected: str) -> bool:
    """The first number in the output is ``expected``."""
    match = _NUMBER.search(output_text)
    return match is not None and match.group() == expected


def grid_summary(cells: list[tuple[int, float]], correct: list[bool]) -> list[dict]:
    """Per (context_tokens, depth) cell, in first-seen order: accuracy, its Wilson
    interval and n."""
    totals: dict[tuple[int, float], list[int]] = {}
    for cell, ok in zip(cells, correct):
        totals.setdefault(cell, [0, 0])
        totals[cell][0] += int(ok)
        totals[cell][1] += 1
    return [{"context_tokens": c, "depth": d, "accuracy": hits / n,
             "accuracy_ci95": wilson_interval(hits, n), "n": n}
            for (c, d), (hits, n) in totals.items()]


def run_grouped(llm, prompts: Sequence[str], groups: Sequence[tuple], depths: Sequence[float],
                params: SamplingParams) -> list:
    """Outputs of ``prompts`` in input order; prompts sharing a ``groups`` key share their
    text up to the needle at ``depths``: the deepest runs first, alone, then the rest of
    its group in one batch (module docstring)."""
    by_group: dict[tuple, list[int]] = {}
    for i, g in enumerate(groups):
        by_group.setdefault(g, []).append(i)
    outputs: list = [None] * len(prompts)
    for members in by_group.values():
        order = sorted(members, key=lambda i: -depths[i])
        for wave in (order[:1], order[1:]):
            if wave:
                for i, out in zip(wave, llm.generate([prompts[i] for i in wave], params)):
                    outputs[i] = out
    return outputs


class RetrievalTask(Task):
    """Base of the grid tasks: subclasses build samples with ``prompt``, ``expected``,
    ``context_tokens``, ``depth``, ``group`` and ``sample_id``, and may override
    ``record``."""

    kind = "accuracy"
    columns: ClassVar[tuple[Column, ...]] = (
        Column("accuracy", "accuracy", "{:.2%}"), Column("acc CI95", "accuracy_ci95", "ci"),
        Column("n", "num_samples", "{}"), Column("Δacc CI", "delta_accuracy", "ci"),
        Column("neg. rate", "negative_rate", "{:.2%}"))

    def is_correct(self, output_text: str, sample) -> bool:
        return first_number_is(output_text, sample.expected)

    def record(self, sample, output) -> dict:
        return {"sample_id": sample.sample_id, "context_tokens": sample.context_tokens,
                "depth": sample.depth, "expected": sample.expected, "output": output.text,
                "correct": self.is_correct(output.text, sample),
                "num_prompt_tokens": output.metrics.num_prompt_tokens,
                "num_cached_prompt_tokens": output.metrics.num_cached_prompt_tokens}

    def run(self, llm, samples: list) -> TaskRun:
        t0 = time.perf_counter()
        params = SamplingParams(max_tokens=ANSWER_TOKENS, stop=(".",))
        with track_peak_kv_bytes(llm.engine) as peak:
            outputs = run_grouped(llm, [s.prompt for s in samples],
                                  [s.group for s in samples], [s.depth for s in samples],
                                  params)
        rows = [self.record(s, o) for s, o in zip(samples, outputs)]
        correct = [r["correct"] for r in rows]
        cells = [(s.context_tokens, s.depth) for s in samples]
        metrics = {**accuracy_metrics(correct), "grid": grid_summary(cells, correct),
                   "num_prompt_tokens": sum(r["num_prompt_tokens"] for r in rows),
                   "num_cached_prompt_tokens": sum(r["num_cached_prompt_tokens"] for r in rows),
                   "kv_bytes_peak": peak[0], "wall_s": time.perf_counter() - t0}
        return TaskRun(metrics, rows)
