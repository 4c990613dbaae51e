"""``passkey``: one 5-digit key hidden at a chosen depth of natural text, asked for at the end.

The classic passkey test (Mohtashami & Jaggi 2023) with natural text instead of repeated
filler, in RULER's single-key NIAH wording (``kvmap.evals.retrieval``; on SmolLM2-135M
the "pass key" wording inside documentation text makes the model drift into the prose).

The grid is ``context_tokens x depths`` (depth: fraction of the document's characters;
the key goes to the nearest sentence boundary) with ``num_samples`` prompts per cell.
Sample s of a context length uses one document at every depth -- a row of the grid
differs only in where the key is, and the prompts share their text up to the key, which
the prefix cache serves (``retrieval.run_grouped``); different samples use different
documents. Each cell's city and key depend only on (seed, length, sample, depth), so
adding a depth or a length does not change the other cells. Correct when the key's
digits appear in the greedy answer.

Construction (``make_cases``) and scoring (``contains_key``) are pure; ``run_passkey``
runs the grid through an ``LLM`` outside the task API (the policy tests use it).
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvmap.evals.base import TASKS, EvalOptions, TaskRun
from kvmap.evals.retrieval import ANSWER_TOKENS, RetrievalTask, needle_prompt
from kvmap.workloads.builders import CITIES
from kvmap.workloads.corpus import encode_text, paragraphs, take_tokens

DEFAULT_CONTEXT_TOKENS = (1024, 2048)
DEFAULT_DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)
DEFAULT_SAMPLES_PER_CELL = 4                 # 2 x 5 x 4 = 40 trials (docs/evals.md)
KEY_MIN, KEY_MAX = 10_000, 100_000


@dataclass(frozen=True)
class PasskeyCase:
    context_tokens: int            # the grid cell's target prompt length
    depth: float                   # the grid cell's requested depth in [0, 1]
    sample: int
    city: str
    key: str                       # 5 digits
    prompt: str
    num_prompt_tokens: int
    key_position_tokens: int       # tokens before the needle sentence in the prompt

    @property
    def sample_id(self) -> str:
        return f"passkey/{self.context_tokens}/{self.depth:g}/{self.sample}"

    @property
    def expected(self) -> str:
        return self.key

    @property
    def group(self) -> tuple[int, int]:     # prompts sharing a document
        return (self.context_tokens, self.sample)


def contains_key(output_text: str, key: str) -> bool:
    """The answer is right when the key's digits appear in it."""
    return key in output_text


def make_cases(tokenizer, context_lengths: Sequence[int], depths: Sequence[float],
               samples: int, seed: int, text: str | None = None) -> list[PasskeyCase]:
    """The grid's prompts, in (context, sample, depth) order. Pure: the same arguments give
    the same prompts. ``text`` replaces the built-in corpus."""
    for d in depths:
        if not 0.0 <= d <= 1.0:
            raise ValueError(f"depth={d!r} must be in [0, 1]")
    if not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples={samples!r} must be a positive integer")
    num_paragraphs = len(paragraphs(text))
    cases = []
    for n in context_lengths:
        for s in range(samples):
            start = int(np.random.default_rng([seed, n, s]).integers(num_paragraphs))
            for d in depths:      # a cell's key does not depend on the other cells
                rng = np.random.default_rng([seed, n, s, round(d * 1000)])
                city = CITIES[int(rng.integers(len(CITIES)))]
                key = str(int(rng.integers(KEY_MIN, KEY_MAX)))
                cases.append(_case(tokenizer, n, float(d), s, city, key, start, text))
    return cases


def _case(tokenizer, context_tokens: int, depth: float, sample: int, city: str, key: str,
          start_paragraph: int, text: str | None) -> PasskeyCase:
    needle = [(depth, city, key)]
    overhead = len(encode_text(tokenizer, needle_prompt("", needle))) + 4   # + the joins
    if context_tokens <= overhead + 16:
        raise ValueError(f"context={context_tokens} tokens leaves no room for text beside "
                         f"the ~{overhead}-token instruction, key and question")
    document = take_tokens(tokenizer, context_tokens - overhead,
                           start_paragraph=start_paragraph, text=text)
    prompt = needle_prompt(document, needle)
    where = prompt.index(f"The special magic number for {city} is {key}.")
    return PasskeyCase(context_tokens, depth, sample, city, key, prompt,
                       len(encode_text(tokenizer, prompt)),
                       len(encode_text(tokenizer, prompt[:where])))


@TASKS.register
class PasskeyTask(RetrievalTask):
    """Single-key retrieval over a context x depth grid (module docstring)."""

    name = "passkey"
    takes = frozenset({"context_tokens", "text", "depths"})

    def __init__(self, options):
        super().__init__(options)
        self.contexts = options.context_tokens or DEFAULT_CONTEXT_TOKENS
        self.depths = options.depths or DEFAULT_DEPTHS
        self.num_samples = options.num_samples or DEFAULT_SAMPLES_PER_CELL

    def max_tokens_needed(self, samples: list | None = None) -> int:
        return max(self.contexts) + ANSWER_TOKENS

    def prepare(self, tokenizer) -> list[PasskeyCase]:
        return make_cases(tokenizer, self.contexts, self.depths, self.num_samples,
                          self.options.seed, self.options.text)

    def is_correct(self, output_text: str, sample: PasskeyCase) -> bool:
        return contains_key(output_text, sample.key)


def run_passkey(llm, context_lengths: Sequence[int], depths: Sequence[float], samples: int,
                seed: int, *, text: str | None = None) -> dict:
    """Run the passkey grid through ``llm`` (its KV configuration: codec and policy).

    Returns the task's metrics (``accuracy``, ``accuracy_ci95``, ``num_samples``, ``n``,
    ``grid``, ``kv_bytes_peak``, ``wall_s``) with ``"task"``, ``"kv"`` and ``"samples"``:
    the per-sample records (``sample_id``, ``context_tokens``, ``depth``, ``expected``,
    ``output``, ``correct``, ...).
    """
    t0 = time.perf_counter()
    task = PasskeyTask(EvalOptions(context_tokens=tuple(context_lengths),
                                   depths=tuple(depths), num_samples=samples, seed=seed,
                                   text=text))
    run: TaskRun = task.run(llm, task.prepare(llm.tokenizer))
    return {"task": "passkey", "kv": str(llm.config.kv), **run.metrics,
            "samples": run.per_sample, "wall_s": time.perf_counter() - t0}


__all__ = ["PasskeyCase", "PasskeyTask", "contains_key", "make_cases", "run_passkey"]
