"""``needle`` (RULER-style multi-key retrieval) and the ``passkey`` adapter.

A ``needle`` prompt hides ``num_needles`` sentences "The special magic number for
<city> is <5 digits>." (distinct cities, distinct numbers) in natural corpus text and asks
for one of them (RULER's multi-key NIAH, Hsieh et al. 2024):

    Some special magic numbers are hidden in the following text. Memorize them.
    <document ... needle_k ... needle_0 (the asked one, at `depth`) ... needle_j ...>
    What is the special magic number for <city_0>? The special magic number for <city_0> is

The asked needle sits at the sentence boundary nearest ``depth`` (a fraction of the
document's characters); the distractors at uniformly random depths. Greedy decoding of
up to ``NEEDLE_ANSWER_TOKENS``; a sample is correct when the first number in the output
is the asked one (a distractor's number, or no number, is wrong). The grid is
``context_tokens x depths`` with ``num_samples`` prompts per cell, each on its own text.
The paired per-sample value is correctness (0/1); ``samples`` lists each prompt's cell,
expected number, output, verdict and whether it answered a distractor's number.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass

import numpy as np

from kvmap.evals import Task, TaskRun
from kvmap.evals.ppl import track_peak_kv_bytes
from kvmap.request import SamplingParams
from kvmap.workloads.builders import CITIES, NEEDLE_ANSWER_TOKENS
from kvmap.workloads.corpus import TextSource

DEFAULT_CONTEXT_TOKENS = (1024, 2048)
DEFAULT_DEPTHS = (0.1, 0.5, 0.9)
DEFAULT_SAMPLES_PER_CELL = 2
DEFAULT_NUM_NEEDLES = 2             # 4 halves full-cache accuracy at 2K on SmolLM2-135M
_SENTENCE_GAP = re.compile(r"(?<=[.!?])\s+")
_SENTENCE_END = re.compile(r'[.!?]["”)]?(?=\s|$)')
_NUMBER = re.compile(r"\d+")


@dataclass(frozen=True)
class NeedleSample:
    prompt: str
    expected: str               # the asked needle's number
    distractors: tuple[str, ...]  # the other needles' numbers
    context_tokens: int         # the grid cell
    depth: float


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


def is_correct(output_text: str, expected: str) -> bool:
    """The first number in the output is ``expected``."""
    match = _NUMBER.search(output_text)
    return match is not None and match.group() == expected


def grid_summary(cells: list[tuple[int, float]], correct: list[bool]) -> list[dict]:
    """Per (context_tokens, depth) cell, in first-seen order: accuracy and n."""
    totals: dict[tuple[int, float], list[int]] = {}
    for cell, ok in zip(cells, correct):
        totals.setdefault(cell, [0, 0])
        totals[cell][0] += int(ok)
        totals[cell][1] += 1
    return [{"context_tokens": c, "depth": d, "accuracy": hits / n, "n": n}
            for (c, d), (hits, n) in totals.items()]


class NeedleTask(Task):
    """Multi-key needle retrieval over a context x depth grid (module docstring)."""

    name = "needle"

    def __init__(self, options):
        super().__init__(options)
        self.contexts = options.context_tokens or DEFAULT_CONTEXT_TOKENS
        self.depths = options.depths or DEFAULT_DEPTHS
        self.num_samples = options.num_samples or DEFAULT_SAMPLES_PER_CELL
        self.num_needles = options.num_needles or DEFAULT_NUM_NEEDLES
        if self.num_needles > len(CITIES):
            raise ValueError(f"num_needles={self.num_needles} exceeds the {len(CITIES)} "
                             f"distinct keys (cities)")

    def max_tokens_needed(self, samples: list | None = None) -> int:
        return max(self.contexts) + NEEDLE_ANSWER_TOKENS

    def prepare(self, tokenizer) -> list[NeedleSample]:
        rng = np.random.default_rng(self.options.seed)
        source = TextSource(tokenizer, rng, self.options.text)
        samples = []
        for num_tokens in self.contexts:
            for depth in self.depths:
                for _ in range(self.num_samples):
                    samples.append(self._sample(source, rng, num_tokens, depth))
        return samples

    def _sample(self, source: TextSource, rng: np.random.Generator, num_tokens: int,
                depth: float) -> NeedleSample:
        cities = [CITIES[i] for i in rng.choice(len(CITIES), self.num_needles, replace=False)]
        numbers = [str(n) for n in rng.choice(np.arange(10000, 100000), self.num_needles,
                                              replace=False)]
        depths = [depth, *rng.uniform(0.0, 1.0, self.num_needles - 1)]
        needles = list(zip((float(d) for d in depths), cities, numbers))
        overhead = source.num_tokens(needle_prompt("", needles)) + 4    # + joins
        if num_tokens <= overhead + 16:
            raise ValueError(f"context={num_tokens} tokens leaves no room for a document "
                             f"beside the ~{overhead}-token needles and question")
        document = source.take(num_tokens - overhead)
        ends = [m.end() for m in _SENTENCE_END.finditer(document)]
        if ends and ends[-1] >= 0.75 * len(document):   # drop the cut's trailing fragment
            document = document[:ends[-1]]
        return NeedleSample(needle_prompt(document, needles), numbers[0], tuple(numbers[1:]),
                            num_tokens, depth)

    def run(self, llm, samples: list[NeedleSample]) -> TaskRun:
        t0 = time.perf_counter()
        params = SamplingParams(max_tokens=NEEDLE_ANSWER_TOKENS)
        with track_peak_kv_bytes(llm.engine) as peak:
            outputs = llm.generate([s.prompt for s in samples], params)
        correct = [is_correct(o.text, s.expected) for o, s in zip(outputs, samples)]
        cells = [(s.context_tokens, s.depth) for s in samples]
        rows = [{"context_tokens": s.context_tokens, "depth": s.depth, "expected": s.expected,
                 "output": o.text, "correct": ok,
                 "distractor": any(is_correct(o.text, d) for d in s.distractors)}
                for s, o, ok in zip(samples, outputs, correct)]
        metrics = {"accuracy": sum(correct) / len(correct), "n": len(correct),
                   "grid": grid_summary(cells, correct), "samples": rows,
                   "kv_bytes_peak": peak[0], "wall_s": time.perf_counter() - t0}
        return TaskRun(metrics, [float(c) for c in correct])


class PasskeyTask(NeedleTask):
    """Classic passkey retrieval, run by ``kvmap.evals.passkey.run_passkey``."""

    name = "passkey"

    def prepare(self, tokenizer) -> list:
        return []          # run_passkey builds its own prompts from the seed

    def run(self, llm, samples: list) -> TaskRun:
        from kvmap.evals.passkey import run_passkey
        t0 = time.perf_counter()
        with track_peak_kv_bytes(llm.engine) as peak:
            result = run_passkey(llm, list(self.contexts), list(self.depths),
                                 self.num_samples, self.options.seed, text=self.options.text)
        per_sample = [float(bool(s["correct"])) for s in result.get("samples", [])]
        metrics = {**{k: v for k, v in result.items() if k not in ("task", "kv")},
                   "kv_bytes_peak": peak[0], "wall_s": time.perf_counter() - t0}
        return TaskRun(metrics, per_sample)

    def compare(self, run: TaskRun, baseline: TaskRun) -> dict:
        if not run.per_sample:        # no per-sample outcomes: no paired delta
            return dict(run.metrics)
        return super().compare(run, baseline)
