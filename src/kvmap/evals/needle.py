"""``needle``: RULER-style multi-key retrieval over a context x depth grid.

A prompt hides ``num_needles`` sentences "The special magic number for <city> is
<5 digits>." (distinct cities, distinct numbers) in natural corpus text and asks for one
of them (RULER's multi-key NIAH, Hsieh et al. 2024):

    Some special magic numbers are hidden in the following text. Memorize them.
    <document ... needle_k ... needle_0 (the asked one, at `depth`) ... needle_j ...>
    What is the special magic number for <city_0>? The special magic number for <city_0> is

The asked needle sits at the sentence boundary nearest ``depth`` (a fraction of the
document's characters). Sample s of a context length uses one document and one set of
distractors (at uniformly random depths) at every depth of the grid, and its own asked
city and number per depth; the prompts of that group share their text up to the first
needle, which the prefix cache serves (``retrieval.run_grouped``). A sample is correct
when the first number in the output is the asked one (a distractor's number, or no
number, is wrong); each record says whether the answer was a distractor's number.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from kvmap.evals.base import TASKS
from kvmap.evals.retrieval import (ANSWER_TOKENS, RetrievalTask, first_number_is,
                                   needle_prompt)
from kvmap.workloads.builders import CITIES
from kvmap.workloads.corpus import TextSource

DEFAULT_CONTEXT_TOKENS = (1024, 2048)
DEFAULT_DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)
DEFAULT_SAMPLES_PER_CELL = 4
DEFAULT_NUM_NEEDLES = 2             # docs/evals.md: why not 4 on SmolLM2-135M
_SENTENCE_END = re.compile(r'[.!?]["”)]?(?=\s|$)')


@dataclass(frozen=True)
class NeedleSample:
    prompt: str
    expected: str                 # the asked needle's number
    distractors: tuple[str, ...]  # the other needles' numbers
    context_tokens: int           # the grid cell
    depth: float
    sample: int

    @property
    def sample_id(self) -> str:
        return f"needle/{self.context_tokens}/{self.depth:g}/{self.sample}"

    @property
    def group(self) -> tuple[int, int]:
        return (self.context_tokens, self.sample)


@TASKS.register
class NeedleTask(RetrievalTask):
    """Multi-key needle retrieval over a context x depth grid (module docstring)."""

    name = "needle"
    takes = frozenset({"context_tokens", "text", "depths", "num_needles"})

    def __init__(self, options):
        super().__init__(options)
        self.contexts = options.context_tokens or DEFAULT_CONTEXT_TOKENS
        self.depths = options.depths or DEFAULT_DEPTHS
        self.num_samples = options.num_samples or DEFAULT_SAMPLES_PER_CELL
        self.num_needles = options.num_needles or DEFAULT_NUM_NEEDLES
        if self.num_needles + len(self.depths) - 1 > len(CITIES):
            raise ValueError(f"num_needles={self.num_needles} with {len(self.depths)} depths "
                             f"needs more distinct keys than the {len(CITIES)} cities")

    def max_tokens_needed(self, samples: list | None = None) -> int:
        return max(self.contexts) + ANSWER_TOKENS

    def prepare(self, tokenizer) -> list[NeedleSample]:
        source = TextSource(tokenizer, np.random.default_rng(self.options.seed),
                            self.options.text)
        samples = []
        for num_tokens in self.contexts:
            for s in range(self.num_samples):
                samples += self._group(source, num_tokens, s)
        return samples

    def _group(self, source: TextSource, num_tokens: int, sample: int) -> list[NeedleSample]:
        """One document and one set of distractors; one asked needle per depth."""
        rng = np.random.default_rng([self.options.seed, num_tokens, sample])
        num_distractors = self.num_needles - 1
        cities = [CITIES[i] for i in rng.choice(len(CITIES), num_distractors + len(self.depths),
                                                replace=False)]
        numbers = [str(n) for n in rng.choice(np.arange(10000, 100000), len(cities),
                                              replace=False)]
        distractors = list(zip((float(d) for d in rng.uniform(0.0, 1.0, num_distractors)),
                               cities[:num_distractors], numbers[:num_distractors]))
        longest = max(cities, key=len)
        overhead = source.num_tokens(needle_prompt("", [(0.0, longest, "00000"),
                                                        *distractors])) + 4   # + joins
        if num_tokens <= overhead + 16:
            raise ValueError(f"context={num_tokens} tokens leaves no room for a document "
                             f"beside the ~{overhead}-token needles and question")
        document = source.take(num_tokens - overhead)
        ends = [m.end() for m in _SENTENCE_END.finditer(document)]
        if ends and ends[-1] >= 0.75 * len(document):   # drop the cut's trailing fragment
            document = document[:ends[-1]]
        out = []
        for i, depth in enumerate(self.depths):
            city, number = cities[num_distractors + i], numbers[num_distractors + i]
            prompt = needle_prompt(document, [(float(depth), city, number), *distractors])
            out.append(NeedleSample(prompt, number, tuple(n for _, _, n in distractors),
                                    num_tokens, float(depth), sample))
        return out

    def record(self, sample: NeedleSample, output) -> dict:
        return {**super().record(sample, output),
                "distractor": any(first_number_is(output.text, d) for d in sample.distractors)}
