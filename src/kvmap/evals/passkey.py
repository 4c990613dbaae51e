"""``passkey``: one 5-digit key hidden at a chosen depth of natural text, asked for at the end.

The classic passkey test (Mohtashami & Jaggi 2023) with natural text instead of repeated
filler, phrased the way SmolLM2-135M answers reliably with a full cache (RULER's
single-key NIAH wording; see CALIBRATION.md -- the "pass key" wording inside
documentation text makes the model drift into the prose):

    A special magic number is hidden in the following text. Memorize it.

    <corpus text ... The special magic number for <city> is <5 digits>. ... text>

    What is the special magic number for <city>? The special magic number for <city> is

The grid is ``context_lengths x depths`` (depth: fraction of the document's characters;
the key goes to the nearest sentence boundary) with ``samples`` prompts per cell. Sample
s of a context length uses the same document at every depth, so a row of the grid
differs only in where the key is. The answer is greedy, at most ``ANSWER_TOKENS``
tokens, and correct when the key's 5 digits appear in it.

Construction (``make_cases``) and scoring (``contains_key``) are pure; ``run_passkey``
runs the cases through an ``LLM`` one at a time (a prompt's whole cache is resident until
a policy compresses it, so batching long prompts would only preempt them).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from kvmap.evals.needle import grid_summary, needle_prompt
from kvmap.request import SamplingParams
from kvmap.workloads.builders import CITIES
from kvmap.workloads.corpus import encode_text, paragraphs, take_tokens

ANSWER_TOKENS = 8                  # "<5 digits>." is 2-4 BPE tokens; room for a space
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


def run_passkey(llm, context_lengths: Sequence[int], depths: Sequence[float], samples: int,
                seed: int, *, text: str | None = None,
                progress: Callable[[PasskeyCase, str, bool], None] | None = None) -> dict:
    """Run the passkey grid through ``llm`` (its KV configuration: codec and policy).

    Returns ``{"task", "kv", "accuracy", "n", "grid": [{"context_tokens", "depth",
    "accuracy", "n"}], "samples": [one dict per case: its fields less the prompt, plus
    "output" and "correct"], "wall_s"}``. ``progress(case, output_text, correct)`` is
    called after each case.
    """
    t0 = time.perf_counter()
    cases = make_cases(llm.tokenizer, context_lengths, depths, samples, seed, text)
    params = SamplingParams(max_tokens=ANSWER_TOKENS)
    rows = []
    for case in cases:
        output = llm.generate([case.prompt], params)[0].text
        correct = contains_key(output, case.key)
        row = {k: v for k, v in asdict(case).items() if k != "prompt"}
        rows.append({**row, "output": output, "correct": correct})
        if progress is not None:
            progress(case, output, correct)
    correct = [r["correct"] for r in rows]
    grid = grid_summary([(r["context_tokens"], r["depth"]) for r in rows], correct)
    return {"task": "passkey", "kv": str(llm.config.kv),
            "accuracy": sum(correct) / len(correct), "n": len(correct), "grid": grid,
            "samples": rows, "wall_s": time.perf_counter() - t0}


__all__ = ["ANSWER_TOKENS", "PasskeyCase", "contains_key", "make_cases", "run_passkey"]
