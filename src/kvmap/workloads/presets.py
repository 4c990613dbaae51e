"""Named workloads and ``build_requests``, the one entry point from spec to requests.

Presets (shrink any of them with ``spec.with_sizes(...)``, e.g. for ``--quick``):

- ``throughput``: 128 independent requests, prompts uniform on [192, 320] tokens (mean
  256), outputs uniform on [96, 160] (mean 128), all in flight at once (closed loop at
  concurrency 128, so the engine's own batch limit is the bottleneck).
- ``long-context``: 8 documents of 4096 tokens, each with a needle sentence ("The special
  magic number for <city> is <5 digits>.") at depths 0, 1/7, ..., 1 and the question
  after the document; ``expected`` holds the number. Closed loop at concurrency 1.
- ``multi-turn``: 16 conversations of 4 turns (64 requests), ShareGPT-like user messages
  and replies capped at 512 tokens; every turn re-sends the history. Closed loop at 16.
- ``mixed``: 128 requests at Poisson 2 requests/s -- ShareGPT-like chat, 1/4 of them in
  4-turn conversations, 1/16 long-context needles.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from kvmap.workloads import builders  # noqa: F401  (the kinds register)
from kvmap.workloads.arrivals import ClosedLoop, Poisson
from kvmap.workloads.corpus import TextSource, TokenizerLike, load_text_file
from kvmap.workloads.lengths import Fixed, Uniform, sharegpt_output, sharegpt_prompt
from kvmap.workloads.spec import WORKLOAD_KINDS, WorkloadRequest, WorkloadSpec

__all__ = ["PRESETS", "WorkloadRequest", "WorkloadSpec", "build_requests", "get_preset"]

PRESETS: dict[str, WorkloadSpec] = {
    spec.name: spec for spec in (
        WorkloadSpec("throughput", "synthetic", 128, prompt_len=Uniform(192, 320),
                     output_len=Uniform(96, 160), arrival=ClosedLoop(128)),
        WorkloadSpec("long-context", "long-context", 8, prompt_len=Fixed(4096),
                     output_len=Fixed(8), arrival=ClosedLoop(1), ignore_eos=False),
        WorkloadSpec("multi-turn", "multi-turn", 64, prompt_len=sharegpt_prompt(512),
                     output_len=sharegpt_output(512), arrival=ClosedLoop(16), num_turns=4),
        WorkloadSpec("mixed", "mixed", 128, prompt_len=sharegpt_prompt(),
                     output_len=sharegpt_output(), arrival=Poisson(2.0)),
    )
}


def get_preset(name: str) -> WorkloadSpec:
    """The preset called ``name``; ``ValueError`` listing the known names otherwise."""
    if name not in PRESETS:
        raise ValueError(f"workload {name!r} is not one of {sorted(PRESETS)}")
    return PRESETS[name]


def build_requests(spec: WorkloadSpec, tokenizer: TokenizerLike) -> list[WorkloadRequest]:
    """The requests of ``spec``, in send order, named ``<spec.name>-00000`` and up.

    Deterministic for a given spec, tokenizer and Python version (the built-in corpus
    comes from the standard library). ``arrival_s`` comes from ``spec.arrival`` (``None``
    throughout for a closed loop); a trace keeps its own times when ``spec.arrival`` is
    ``None``. ``tokenizer`` needs ``encode(str) -> ids`` (no BOS) and ``decode``.
    """
    rng = np.random.default_rng(spec.seed)
    text = load_text_file(spec.corpus_path) if spec.corpus_path else None
    drafts = WORKLOAD_KINDS[spec.kind](spec, TextSource(tokenizer, rng, text))
    if spec.kind == "trace" and spec.arrival is None:
        times_s = [d.arrival_s for d in drafts]
    else:
        times = spec.arrival.arrival_times_s(rng, len(drafts))
        times_s = [None] * len(drafts) if times is None else [float(t) for t in times]
    return [replace(d, request_id=f"{spec.name}-{i:05d}", arrival_s=t)
            for i, (d, t) in enumerate(zip(drafts, times_s))]
